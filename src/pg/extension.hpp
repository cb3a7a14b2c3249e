// The extension the workers serve, as the catalog of the current database sees it: whether it
// exists, under which OID, at which schema version; and the hook that tells the launcher at once
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
// Raises ERROR 55000 (with the command to run as the hint) unless the installed schema is the
// one this library was built for; for code that depends on the tables' shape.
void require_current_schema(const char* what);
// Installs the object-access hook that wakes the launcher when a transaction that created,
// updated or dropped an extension commits; from _PG_init.
void install_extension_hook();

}  // namespace eventbox::pg
