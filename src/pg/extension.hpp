// The extension the workers serve, as the catalog of the current database sees it: whether it
// exists, under which OID, at which schema version, who owns it; and the hook that tells the
// supervisor at once
// when an extension is created, updated or dropped.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace eventbox::pg {

// The schema version this library was built for (the control file's default_version).
inline constexpr const char* kLibraryVersion = EVENTBOX_VERSION;

struct ExtensionState {
    Oid oid;           // InvalidOid: not installed in this database
    char version[64];  // pg_extension.extversion, empty when not installed
};

// Reads pg_extension for pg_eventbox; needs a transaction.
ExtensionState extension_state();
// True when the installed schema is the one this library was built for.
bool schema_matches(const ExtensionState& state);
// Owner of schema eventbox, i.e. of the extension's objects: the API's bodies and the dry run
// read and write eventbox's tables as it. Needs a transaction.
Oid schema_owner();
// Raises ERROR 55000 (with the command to run as the hint) unless the installed schema is the
// one this library was built for; for code that depends on the tables' shape.
void require_current_schema(const char* what);
// Installs the object-access hook that wakes the launcher when a transaction that created,
// updated or dropped an extension commits, and the utility hook below; from _PG_init.
void install_extension_hook();

// The workers' side of the schema lock: each worker transaction that reads or writes the
// extension's tables takes it in share mode before touching any of them (held to its end).
// DROP EXTENSION pg_eventbox, ALTER EXTENSION pg_eventbox and DROP SCHEMA eventbox take it in
// exclusive mode (utility hook) before they lock the tables: they wait for the transactions in
// flight to end and new ones wait for them, instead of taking the tables' locks in another order
// than a worker holding some of them (a deadlock, which failed the DROP). Returns false when
// the install this process first worked on was dropped or re-created (seen after waiting).
bool lock_schema_for_work();
// lock_schema_for_work() for the relay, ingest and handler workers: exits quietly (LOG) when it
// returns false.
void lock_schema_or_exit();

}  // namespace eventbox::pg
