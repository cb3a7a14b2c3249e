// The extension's state and the hook that announces changes to it (see pg/extension.hpp).
#include "pg/extension.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
}

#include "pg/shmem.hpp"

namespace eventbox::pg {

ExtensionState extension_state() {
    ExtensionState state{InvalidOid, {0}};
    Relation rel = table_open(ExtensionRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
                CStringGetDatum("pg_eventbox"));
    SysScanDesc scan = systable_beginscan(rel, ExtensionNameIndexId, true, nullptr, 1, &key);
    HeapTuple tuple = systable_getnext(scan);
    if (HeapTupleIsValid(tuple)) {
        Form_pg_extension form = reinterpret_cast<Form_pg_extension>(GETSTRUCT(tuple));
        state.oid = form->oid;
        bool isnull;
        Datum version = heap_getattr(tuple, Anum_pg_extension_extversion, RelationGetDescr(rel),
                                     &isnull);
        if (!isnull) {
            char* value = TextDatumGetCString(version);
            strlcpy(state.version, value, sizeof state.version);
            pfree(value);
        }
    }
    systable_endscan(scan);
    table_close(rel, AccessShareLock);
    return state;
}

bool schema_matches(const ExtensionState& state) {
    return OidIsValid(state.oid) && strcmp(state.version, kLibraryVersion) == 0;
}

void require_current_schema(const char* what) {
    ExtensionState state = extension_state();
    if (schema_matches(state)) return;
    if (!OidIsValid(state.oid))
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("%s needs the pg_eventbox extension in this database", what),
                        errhint("Run CREATE EXTENSION pg_eventbox.")));
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("%s needs pg_eventbox schema version %s, but this database has %s", what,
                    kLibraryVersion, state.version),
             errdetail("The installed library is version %s; its schema was not updated yet.",
                       kLibraryVersion),
             errhint("Run ALTER EXTENSION pg_eventbox UPDATE in this database.")));
}

namespace {

object_access_hook_type prev_object_access_hook = nullptr;

// CREATE, ALTER ... UPDATE and DROP EXTENSION: the launcher re-reads the extension's state when
// the transaction commits, instead of finding out by polling.
void on_object_access(ObjectAccessType access, Oid class_id, Oid object_id, int sub_id,
                      void* arg) {
    if (prev_object_access_hook) prev_object_access_hook(access, class_id, object_id, sub_id, arg);
    if (class_id == ExtensionRelationId &&
        (access == OAT_POST_CREATE || access == OAT_POST_ALTER || access == OAT_DROP))
        shmem::wake_launcher_at_commit();
}

}  // namespace

void install_extension_hook() {
    prev_object_access_hook = object_access_hook;
    object_access_hook = on_object_access;
}

}  // namespace eventbox::pg
