// The C++/PostgreSQL boundary (see CONTRIBUTING.md, "The boundary"):
//  - call_cpp(): every entry from PostgreSQL into C++ (SQL functions, worker steps) runs its C++
//    body inside a try block; an exception is captured as plain data and raised as a PostgreSQL
//    ERROR with its SQLSTATE only after the C++ scope has closed.
//  - pg_guard(): every call from C++ into PostgreSQL that can ERROR runs inside PG_TRY; the error
//    is copied, flushed and rethrown as eventbox::Error (same SQLSTATE, message, detail, hint)
//    after PG_END_TRY, so no longjmp ever crosses a C++ frame.
#pragma once

extern "C" {
#include "postgres.h"

#include "utils/elog.h"
#include "utils/memutils.h"
}

#include <type_traits>
#include <utility>

#include "core/error.hpp"

namespace eventbox::pg {

// Raises `report` as a PostgreSQL ERROR. Never returns.
[[noreturn]] void raise_report(const ErrorReport& report);

// Converts a copied PostgreSQL error into an eventbox::Error and throws it; frees `edata`.
[[noreturn]] void throw_pg_error(ErrorData* edata);

// Raises an internal ERROR when an exception unwound out of a PG_TRY block (which left
// PG_exception_stack pointing into a dead frame); restores the handler `saved` first.
void check_no_open_pg_try(sigjmp_buf* saved);

template <typename F>
auto call_cpp(F&& body) -> decltype(body()) {
    using R = decltype(body());
    ErrorReport report;
    sigjmp_buf* saved = PG_exception_stack;
    try {
        if constexpr (std::is_void_v<R>) {
            body();
            return;
        } else {
            return body();
        }
    } catch (...) {
        capture_current_exception(report);
    }
    check_no_open_pg_try(saved);
    raise_report(report);
}

// Runs fn(arg) inside PG_TRY; on a PostgreSQL error returns a copy of it (flushed), else nullptr.
ErrorData* run_guarded(void (*fn)(void*), void* arg);

template <typename F>
auto pg_guard(F&& body) -> decltype(body()) {
    using R = decltype(body());
    if constexpr (std::is_void_v<R>) {
        auto trampoline = [](void* p) { (*static_cast<std::remove_reference_t<F>*>(p))(); };
        if (ErrorData* edata = run_guarded(trampoline, &body)) throw_pg_error(edata);
    } else {
        static_assert(std::is_trivially_copyable_v<R>, "pg_guard returns plain values only");
        struct Call {
            std::remove_reference_t<F>* body;
            R result;
        } call{&body, R{}};
        auto trampoline = [](void* p) {
            auto* c = static_cast<Call*>(p);
            c->result = (*c->body)();
        };
        if (ErrorData* edata = run_guarded(trampoline, &call)) throw_pg_error(edata);
        return call.result;
    }
}

}  // namespace eventbox::pg
