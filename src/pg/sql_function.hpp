// How SQL-callable functions are declared, and the argument checks they share: one macro per
// function (its fmgr info and C linkage), one file of entry points per subsystem.
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

// Declares the SQL-callable C function `name` (version-1 calling convention, C linkage) and
// opens its definition: EVENTBOX_SQL_FUNCTION(eventbox_process) { ... PG_RETURN_...; }
#define EVENTBOX_SQL_FUNCTION(name) \
    extern "C" {                    \
    PG_FUNCTION_INFO_V1(name);      \
    }                               \
    extern "C" PGDLLEXPORT Datum name(PG_FUNCTION_ARGS)

namespace eventbox::pg {

// Argument `n`, the name of a `what` (e.g. "subscription"), as a C string; NULL raises 22004.
char* required_name_arg(FunctionCallInfo fcinfo, int n, const char* what);
// Argument `n` as an int, `fallback` when NULL; below 1 raises 22023 naming `what`, with `hint`.
int positive_int_arg(FunctionCallInfo fcinfo, int n, int fallback, const char* what,
                     const char* hint);

}  // namespace eventbox::pg
