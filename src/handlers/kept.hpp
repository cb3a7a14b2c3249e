// The kept statements of the handler side: each file declares those it runs beside the code
// that runs them, with the index their plan must use (docs/design/plans.md), and each is
// prepared the first time it runs. PostgreSQL side.
#pragma once

extern "C" {
#include "postgres.h"

#include "executor/spi.h"
}

#include "workers/common.hpp"

namespace eventbox::handlers {

// A statement kept across transactions: its text and argument types, and its plan once prepared.
struct KeptStatement {
    const char* sql;
    int nargs;
    Oid types[11];
    SPIPlanPtr plan;  // nullptr until prepared
};

// The statement's kept plan, prepared first if need be (worker::prepare_kept, naming `who` in
// its errors; SPI connected).
inline SPIPlanPtr prepared(KeptStatement& statement, const char* who) {
    if (statement.plan == nullptr)
        statement.plan = worker::prepare_kept(who, statement.sql, statement.nargs, statement.types);
    return statement.plan;
}

// worker::exec_kept() of the statement's plan: its planner rules hold while it runs.
inline void exec_kept(const char* who, KeptStatement& statement, Datum* values, bool read_only,
                      int expected, worker::Access access = worker::Access::kIndex) {
    worker::exec_kept(who, prepared(statement, who), values, read_only, expected, access);
}

}  // namespace eventbox::handlers
