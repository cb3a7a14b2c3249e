// Raising and catching across the C++/PostgreSQL boundary (see pg/boundary.hpp).
#include "pg/boundary.hpp"

#include <string>

namespace eventbox::pg {

void raise_report(const ErrorReport& report) {
    const char* s = report.sqlstate;
    int code = MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4]);
    ereport(ERROR, (errcode(code), errmsg_internal("%s", report.message),
                    report.detail[0] ? errdetail_internal("%s", report.detail) : 0,
                    report.hint[0] ? errhint("%s", report.hint) : 0));
    pg_unreachable();
}

void check_no_open_pg_try(sigjmp_buf* saved) {
    if (PG_exception_stack == saved) return;
    PG_exception_stack = saved;
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
                    errmsg("a C++ exception left a PostgreSQL error handler open"),
                    errhint("This is a bug in pg_eventbox: a PostgreSQL call that can raise an "
                            "error must run through pg_guard().")));
}

ErrorData* run_guarded(void (*fn)(void*), void* arg) {
    MemoryContext caller_context = CurrentMemoryContext;
    ErrorData* volatile edata = nullptr;
    PG_TRY();
    { fn(arg); }
    PG_CATCH();
    {
        MemoryContextSwitchTo(caller_context);
        edata = CopyErrorData();
        FlushErrorState();
    }
    PG_END_TRY();
    return edata;
}

void throw_pg_error(ErrorData* edata) {
    const char* code = unpack_sql_state(edata->sqlerrcode);
    std::string message = edata->message ? edata->message : "unknown PostgreSQL error";
    std::string detail = edata->detail ? edata->detail : "";
    std::string hint = edata->hint ? edata->hint : "";
    FreeErrorData(edata);
    throw Error(code, std::move(message), std::move(detail), std::move(hint));
}

}  // namespace eventbox::pg
