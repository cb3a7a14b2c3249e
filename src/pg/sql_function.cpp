// Argument checks shared by the SQL entry points (see pg/sql_function.hpp).
#include "pg/sql_function.hpp"

extern "C" {
#include "utils/builtins.h"
}

namespace eventbox::pg {

char* required_name_arg(FunctionCallInfo fcinfo, int n, const char* what) {
    if (PG_ARGISNULL(n))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                        errmsg("%s must not be NULL", what), errhint("Pass the %s's name.", what)));
    return text_to_cstring(PG_GETARG_TEXT_PP(n));
}

int positive_int_arg(FunctionCallInfo fcinfo, int n, int fallback, const char* what,
                     const char* hint) {
    int value = PG_ARGISNULL(n) ? fallback : PG_GETARG_INT32(n);
    if (value < 1)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s must be at least 1", what), errhint("%s", hint)));
    return value;
}

}  // namespace eventbox::pg
