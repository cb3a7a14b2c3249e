// The extension's state and the hook that announces changes to it (see pg/extension.hpp).
#include "pg/extension.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/syscache.h"
}

#include "pg/guc.hpp"
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
        Datum version =
            heap_getattr(tuple, Anum_pg_extension_extversion, RelationGetDescr(rel), &isnull);
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

Oid schema_owner() {
    Oid schema = get_namespace_oid("eventbox", false);
    HeapTuple tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(schema));
    if (!HeapTupleIsValid(tuple)) elog(ERROR, "cache lookup failed for schema eventbox");
    Oid owner = reinterpret_cast<Form_pg_namespace>(GETSTRUCT(tuple))->nspowner;
    ReleaseSysCache(tuple);
    return owner;
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

// CREATE, ALTER ... UPDATE and DROP EXTENSION: the supervisor re-reads the extension's state when
// the transaction commits, instead of finding out by polling.
void on_object_access(ObjectAccessType access, Oid class_id, Oid object_id, int sub_id, void* arg) {
    if (prev_object_access_hook) prev_object_access_hook(access, class_id, object_id, sub_id, arg);
    if (class_id == ExtensionRelationId &&
        (access == OAT_POST_CREATE || access == OAT_POST_ALTER || access == OAT_DROP))
        shmem::wake_supervisor_at_commit();
}

// The schema lock of the current database, an advisory tag in a field4 of our own (lanes use
// 0x4542 and 0x4543) so it never meets users' advisory locks.
LOCKTAG schema_tag() {
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, 0x4544);
    return tag;
}

ProcessUtility_hook_type prev_utility_hook = nullptr;

// CREATE EXTENSION in a database eventbox.database does not list: send() works, but no worker
// relays its outbox or fills its inbox. Said once, at creation.
void warn_if_not_served() {
    const char* name = get_database_name(MyDatabaseId);
    if (name == nullptr || guc::database_listed(name)) return;
    ereport(WARNING,
            (errmsg("database \"%s\" is not in eventbox.database: no pg_eventbox worker serves it",
                    name),
             errdetail("send() stores messages in eventbox.outbox, but nothing relays them, and "
                       "no subscription of this database is consumed."),
             errhint("Add the database to eventbox.database and restart the server.")));
}

bool names(const List* objects, const char* name) {
    ListCell* lc;
    foreach (lc, objects) {
        const Node* n = static_cast<const Node*>(lfirst(lc));
        if (IsA(n, String) && strcmp(strVal(n), name) == 0) return true;
    }
    return false;
}

// Whether the statement drops or alters the extension or its schema.
bool changes_schema(const Node* tree) {
    if (IsA(tree, DropStmt)) {
        const DropStmt* s = reinterpret_cast<const DropStmt*>(tree);
        return (s->removeType == OBJECT_EXTENSION && names(s->objects, "pg_eventbox")) ||
               (s->removeType == OBJECT_SCHEMA && names(s->objects, "eventbox"));
    }
    if (IsA(tree, AlterExtensionStmt))
        return strcmp(reinterpret_cast<const AlterExtensionStmt*>(tree)->extname, "pg_eventbox") ==
               0;
    if (IsA(tree, AlterExtensionContentsStmt))
        return strcmp(reinterpret_cast<const AlterExtensionContentsStmt*>(tree)->extname,
                      "pg_eventbox") == 0;
    return false;
}

void on_utility(PlannedStmt* pstmt, const char* query, bool read_only_tree,
                ProcessUtilityContext context, ParamListInfo params, QueryEnvironment* env,
                DestReceiver* dest, QueryCompletion* qc) {
    if (changes_schema(pstmt->utilityStmt)) {
        LOCKTAG tag = schema_tag();
        (void)LockAcquire(&tag, ExclusiveLock, false, false);
        shmem::schema_changing();
    }
    if (prev_utility_hook)
        prev_utility_hook(pstmt, query, read_only_tree, context, params, env, dest, qc);
    else
        standard_ProcessUtility(pstmt, query, read_only_tree, context, params, env, dest, qc);
    if (IsA(pstmt->utilityStmt, CreateExtensionStmt) &&
        strcmp(reinterpret_cast<const CreateExtensionStmt*>(pstmt->utilityStmt)->extname,
               "pg_eventbox") == 0)
        warn_if_not_served();
}

}  // namespace

void install_extension_hook() {
    prev_object_access_hook = object_access_hook;
    object_access_hook = on_object_access;
    prev_utility_hook = ProcessUtility_hook;
    ProcessUtility_hook = on_utility;
}

namespace {
Oid work_extension = InvalidOid;  // the install this process's work started on
uint64 seen_schema_changes = 0;   // shmem::schema_changes() when it last checked
}  // namespace

bool lock_schema_for_work() {
    LOCKTAG tag = schema_tag();
    if (LockAcquire(&tag, ShareLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
        (void)LockAcquire(&tag, ShareLock, false, false);
    // A DROP or ALTER EXTENSION may also have come and gone between this process's transactions
    // without it waiting (a DROP committed, the CREATE not yet run): the count tells.
    uint64 changes = shmem::schema_changes();
    if (OidIsValid(work_extension) && changes == seen_schema_changes) return true;
    // Once per process, to know its install; and after a DROP or ALTER EXTENSION.
    AcceptInvalidationMessages();
    seen_schema_changes = changes;
    Oid now = extension_state().oid;
    if (!OidIsValid(work_extension)) work_extension = now;
    return OidIsValid(now) && now == work_extension;
}

void lock_schema_or_exit() {
    if (lock_schema_for_work()) return;
    // The supervisor stops the workers of an install that went away and starts new ones for
    // the one that replaced it; until its signal arrives, this one must not run its statements
    // against the new install's tables.
    ereport(LOG, (errmsg("%s: pg_eventbox was dropped or re-created; exiting",
                         MyBgworkerEntry ? MyBgworkerEntry->bgw_type : "eventbox worker"),
                  errdetail("The supervisor starts the workers of the current install.")));
    proc_exit(0);
}

}  // namespace eventbox::pg
