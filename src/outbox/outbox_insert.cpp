// send()'s direct write of an outbox row, into the open one of the rotated tables
// eventbox.outbox_rows_0, _1 and _2 (docs/design/outbox-rotation.md). An INSERT statement works
// out at each start what the table needs: it opens every index, builds its IndexInfo and
// prepares the predicates of partial ones. Done per send(), that was about a quarter of the
// call. Here it is worked out once per rotated table and kept while the table's definition
// stays the same: a
// relcache invalidation of the table or of one of its indexes (DDL, CREATE INDEX
// CONCURRENTLY's steps, a cache reset) marks it stale, and the next call builds it again. Every
// call still opens and locks the table and its indexes (no relcache reference outlives the
// call, so TRUNCATE or ALTER later in the transaction are not refused as "in use"), and the
// locks are held to the end of the transaction.
//
// PostgreSQL-side code: no C++ object lives on these frames.
extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "commands/sequence.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
}

#include "outbox/outbox_insert.hpp"
#include "pg/shmem.hpp"

namespace eventbox::outbox {

namespace {

// Columns by name: the shape of the rotated tables.
const char* const kNames[] = {"id",      "message_id", "topic",     "key",
                              "payload", "headers",    "created_at"};
constexpr int kColumns = sizeof kNames / sizeof kNames[0];
// Columns written only by send() inside a handler.
const char* const kCauseNames[] = {"cause_subscription", "cause_received_at"};

// What the inserts need from the table's definition.
struct Shape {
    Oid relid;
    Oid owner;
    bool plain;  // false: a shape this code does not write; the caller uses SQL
    int attno[kColumns];
    int cause_attno[2];  // -1: the table has no such column
    int n_indexes;
    Oid* index_oids;
    ResultRelInfo* info;  // its index relations are opened by each call
    EState* estate;       // for the predicates' evaluation (its per-tuple context)
    TupleTableSlot* slot;
    Datum empty_headers;  // '{}'
};

// One cached shape per rotated table, each in its own memory context.
struct Cached {
    MemoryContext context = nullptr;
    Shape* shape = nullptr;
    bool stale = false;
    bool building = false;  // build_shape() runs (or failed)
};
Cached cached[kTables];
bool callback_registered = false;

// The open table's number as this transaction first read it, with the transaction's full xid,
// eventbox.outbox_state's oid and that table's oid then.
struct OpenTableRead {
    FullTransactionId xid = InvalidFullTransactionId;
    Oid state_relid = InvalidOid;
    int open = 0;
    Oid rows_relid = InvalidOid;
};
OpenTableRead last_open_read;

void on_relcache_invalidation(Datum, Oid relid) {
    // An invalidation of the table read forgets its number: a TRUNCATE in this transaction
    // (truncate_outbox() empties the closed tables) sends one, and the next row then goes to the
    // table open after it. The relay cannot truncate that table while this transaction runs;
    // other invalidations of it (its statistics) only cost a read of outbox_state.
    if (relid == InvalidOid || relid == last_open_read.rows_relid) last_open_read = OpenTableRead{};
    for (Cached& c : cached) {
        // Taking an index's lock while the shape is built may take in invalidations: what was
        // read before them may be outdated, and their relation ids are not all known yet.
        if (c.building) c.stale = true;
        if (c.shape == nullptr || c.stale) continue;
        if (relid == InvalidOid || relid == c.shape->relid) {
            c.stale = true;
            continue;
        }
        for (int i = 0; i < c.shape->n_indexes; ++i)
            if (c.shape->index_oids[i] == relid) c.stale = true;
    }
}

void register_callback() {
    if (callback_registered) return;
    CacheRegisterRelcacheCallback(on_relcache_invalidation, (Datum)0);
    callback_registered = true;
}

// Works out the shape of `rel` (rotated table n, opened and locked) into its context.
void build_shape(Cached& c, Relation rel) {
    c.shape = nullptr;
    c.building = true;
    c.stale = false;
    register_callback();
    if (c.context == nullptr)
        c.context =
            AllocSetContextCreate(TopMemoryContext, "eventbox outbox insert", ALLOCSET_SMALL_SIZES);
    else
        MemoryContextReset(c.context);
    MemoryContext old = MemoryContextSwitchTo(c.context);
    auto* s = static_cast<Shape*>(palloc0(sizeof(Shape)));
    s->relid = RelationGetRelid(rel);
    s->owner = rel->rd_rel->relowner;
    TupleDesc desc = RelationGetDescr(rel);
    int found = 0;
    for (int c = 0; c < kColumns; ++c) {
        s->attno[c] = -1;
        for (int a = 0; a < desc->natts; ++a) {
            Form_pg_attribute att = TupleDescAttr(desc, a);
            if (!att->attisdropped && strcmp(NameStr(att->attname), kNames[c]) == 0) {
                s->attno[c] = a;
                ++found;
                break;
            }
        }
    }
    for (int c = 0; c < 2; ++c) {
        s->cause_attno[c] = -1;
        for (int a = 0; a < desc->natts; ++a) {
            Form_pg_attribute att = TupleDescAttr(desc, a);
            if (!att->attisdropped && strcmp(NameStr(att->attname), kCauseNames[c]) == 0)
                s->cause_attno[c] = a;
        }
    }
    s->plain = rel->rd_rel->relkind == RELKIND_RELATION && rel->trigdesc == nullptr &&
               !rel->rd_rules && found == kColumns;
    if (s->plain) {
        List* indexes = RelationGetIndexList(rel);
        s->n_indexes = list_length(indexes);
        s->index_oids = static_cast<Oid*>(palloc(sizeof(Oid) * Max(s->n_indexes, 1)));
        auto** infos = static_cast<IndexInfo**>(palloc(sizeof(IndexInfo*) * Max(s->n_indexes, 1)));
        int i = 0;
        ListCell* lc;
        foreach (lc, indexes) {
            Relation index = index_open(lfirst_oid(lc), RowExclusiveLock);
            IndexInfo* ii = BuildIndexInfo(index);
            // What the executor sets up per statement besides (expression indexes, exclusion
            // constraints, deferred unique checks) is left to the SQL path, and so are index
            // types other than B-tree: some keep state between insertions (ii_AmCache) that
            // points to the index relation of one statement.
            if (index->rd_rel->relam != BTREE_AM_OID || ii->ii_Expressions != NIL ||
                ii->ii_ExclusionOps != nullptr ||
                (index->rd_index->indisunique && !index->rd_index->indimmediate))
                s->plain = false;
            // ExecPrepareQual(), kept here instead of in a statement's memory.
            if (ii->ii_Predicate != NIL)
                ii->ii_PredicateState =
                    ExecInitQual(reinterpret_cast<List*>(
                                     expression_planner(reinterpret_cast<Expr*>(ii->ii_Predicate))),
                                 nullptr);
            s->index_oids[i] = RelationGetRelid(index);
            infos[i++] = ii;
            index_close(index, NoLock);
        }
        s->info = makeNode(ResultRelInfo);
        InitResultRelInfo(s->info, rel, 1, nullptr, 0);
        s->info->ri_NumIndices = s->n_indexes;
        s->info->ri_IndexRelationDescs =
            static_cast<RelationPtr>(palloc0(sizeof(Relation) * Max(s->n_indexes, 1)));
        s->info->ri_IndexRelationInfo = infos;
        s->estate = CreateExecutorState();
        s->slot = MakeSingleTupleTableSlot(CreateTupleDescCopy(desc), &TTSOpsHeapTuple);
        s->empty_headers = DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"));
    }
    MemoryContextSwitchTo(old);
    c.shape = s;  // used by this call even when stale: the next one builds it again
    c.building = false;
}

// Rotated table n opened with RowExclusiveLock, its shape up to date.
Relation open_rows(int n) {
    Cached& c = cached[n];
    Relation rel = nullptr;
    if (c.shape != nullptr && !c.stale) rel = try_table_open(c.shape->relid, RowExclusiveLock);
    // Invalidations are taken in when the lock is first acquired in a transaction.
    if (rel != nullptr && c.stale) {
        table_close(rel, NoLock);
        rel = nullptr;
    }
    if (rel == nullptr) {
        char name[32];
        snprintf(name, sizeof name, "outbox_rows_%d", n);
        rel = table_openrv(makeRangeVar(const_cast<char*>("eventbox"), pstrdup(name), -1),
                           RowExclusiveLock);
        build_shape(c, rel);
    }
    return rel;
}

}  // namespace

namespace {

// eventbox.outbox_state, or InvalidOid in a schema older than 0.6.0 (the library is replaced
// before ALTER EXTENSION ... UPDATE runs, and send() keeps working in between).
Oid state_table() {
    static Oid state_relid = InvalidOid;
    // Looked up again when the extension was re-created or updated in this session.
    if (!OidIsValid(state_relid) || !SearchSysCacheExists1(RELOID, ObjectIdGetDatum(state_relid)))
        state_relid = RangeVarGetRelid(
            makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("outbox_state"), -1),
            NoLock, true);
    return state_relid;
}

// In a schema older than 0.6.0, eventbox.outbox is still the table: its owner and whether it
// has the cause columns, for the caller's SQL path (a live upgrade is short; its sends need not
// be fast).
void legacy_outbox(Oid* owner, bool* cause_columns) {
    Oid relid = RangeVarGetRelid(
        makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("outbox"), -1), NoLock,
        false);
    HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
    if (!HeapTupleIsValid(tuple)) elog(ERROR, "cache lookup failed for relation %u", relid);
    *owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner;
    ReleaseSysCache(tuple);
    *cause_columns = get_attnum(relid, "cause_subscription") != InvalidAttrNumber &&
                     get_attnum(relid, "cause_received_at") != InvalidAttrNumber;
}

// Reads the open table's number from eventbox.outbox_state under a snapshot taken now.
int read_open_table(Oid state_relid) {
    Relation rel = table_open(state_relid, AccessShareLock);
    Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
    TableScanDesc scan = table_beginscan(rel, snapshot, 0, nullptr);
    TupleDesc desc = RelationGetDescr(rel);
    int open = 0;  // no row says otherwise: table 0 (eventbox.outbox_state starts empty)
    HeapTuple tuple;
    while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
        bool n_null, state_null;
        // Columns n (1) and state (2), as eventbox.outbox_state defines them.
        int16 n = DatumGetInt16(heap_getattr(tuple, 1, desc, &n_null));
        Datum state = heap_getattr(tuple, 2, desc, &state_null);
        if (n_null || state_null || n < 0 || n >= kTables) continue;
        if (strcmp(TextDatumGetCString(state), "open") == 0) {
            open = n;
            break;
        }
    }
    table_endscan(scan);
    UnregisterSnapshot(snapshot);
    table_close(rel, AccessShareLock);
    return open;
}

}  // namespace

int open_table() {
    // Read under a snapshot taken now, after the caller's xid was assigned: a rotation the relay
    // committed before is seen, and one it commits later reads the next xid after this one, so
    // the relay waits for this writer before it takes the old table's max_id as final.
    Oid state_relid = state_table();
    if (!OidIsValid(state_relid))
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("eventbox.outbox_state does not exist"),
                        errhint("Run ALTER EXTENSION pg_eventbox UPDATE in this database.")));
    // Read once per transaction: the relay waits for the whole writer, not for its first row,
    // so the table the transaction first read stays open to it until it ends (a rotation
    // committed since waits for this xid, and the relay cannot truncate the table and open it
    // again before; a truncate by this transaction forgets the number: on_relcache_invalidation()).
    // A scan per send() was 5-6% of the handler workers' CPU end to end (bench/NOTEBOOK.md,
    // 2026-11-28).
    register_callback();
    FullTransactionId xid = GetTopFullTransactionIdIfAny();
    if (FullTransactionIdIsValid(xid) && FullTransactionIdEquals(xid, last_open_read.xid) &&
        last_open_read.state_relid == state_relid)
        return last_open_read.open;
    int open = read_open_table(state_relid);
    char name[32];
    snprintf(name, sizeof name, "outbox_rows_%d", open);
    Oid rows_relid = get_relname_relid(name, get_rel_namespace(state_relid));
    last_open_read = OpenTableRead{xid, state_relid, open, rows_relid};
    return open;
}

int64 next_id(bool check_permissions) {
    shmem::publish_outbox_writer(GetTopTransactionId());
    static Oid sequence = InvalidOid;
    // Looked up again when the extension was re-created in this session.
    if (!OidIsValid(sequence) || !SearchSysCacheExists1(RELOID, ObjectIdGetDatum(sequence)))
        sequence = RangeVarGetRelid(
            makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("outbox_id_seq"), -1),
            NoLock, false);
    return nextval_internal(sequence, check_permissions);
}

namespace {

// The first row of `message_id` in rotated table n that the dirty snapshot sees (committed, or
// written by a transaction still running: `dirty` then names it); false when there is none.
bool find_message_id(int n, Oid schema, pg_uuid_t* message_id, SnapshotData* dirty) {
    char name[64];
    snprintf(name, sizeof name, "outbox_rows_%d", n);
    Oid relid = get_relname_relid(name, schema);
    snprintf(name, sizeof name, "outbox_rows_%d_message_id_key", n);
    Oid indexid = get_relname_relid(name, schema);
    if (!OidIsValid(relid) || !OidIsValid(indexid)) return false;
    Relation rel = table_open(relid, AccessShareLock);
    Relation index = index_open(indexid, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_UUID_EQ, UUIDPGetDatum(message_id));
    InitDirtySnapshot(*dirty);
    IndexScanDesc scan = index_beginscan(rel, index, dirty, 1, 0);
    index_rescan(scan, &key, 1, nullptr, 0);
    TupleTableSlot* slot = table_slot_create(rel, nullptr);
    bool found = index_getnext_slot(scan, ForwardScanDirection, slot);
    ExecDropSingleTupleTableSlot(slot);
    index_endscan(scan);
    index_close(index, AccessShareLock);
    table_close(rel, AccessShareLock);
    return found;
}

}  // namespace

void check_message_id_elsewhere(pg_uuid_t* message_id, int open) {
    Oid schema = get_namespace_oid("eventbox", false);
    for (int n = 0; n < kTables; ++n) {
        if (n == open) continue;
        SnapshotData dirty;
        while (find_message_id(n, schema, message_id, &dirty)) {
            TransactionId writer = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
            if (TransactionIdIsValid(writer)) {
                // A writer still running: its outcome decides (a rolled-back row, or a deleted
                // one, is not a duplicate).
                XactLockTableWait(writer, nullptr, nullptr, XLTW_None);
                continue;
            }
            Datum id_text = DirectFunctionCall1(uuid_out, UUIDPGetDatum(message_id));
            ereport(ERROR,
                    (errcode(ERRCODE_UNIQUE_VIOLATION),
                     errmsg("duplicate key value violates unique constraint "
                            "\"outbox_rows_%d_message_id_key\"",
                            n),
                     errdetail("Key (message_id)=(%s) already exists.", DatumGetCString(id_text)),
                     errhint("message_id is unique across the outbox: send it once.")));
        }
    }
}

bool insert_row(pg_uuid_t* message_id, bool given_id, text* topic, text* key, bytea* payload,
                Jsonb* headers, const Cause* cause, Oid* owner, bool* cause_columns) {
    // The xid first (published as an outbox writer), then the open table: see open_table().
    shmem::publish_outbox_writer(GetTopTransactionId());
    if (!OidIsValid(state_table())) {
        legacy_outbox(owner, cause_columns);
        return false;
    }
    int n = open_table();
    Relation rel = open_rows(n);
    Shape* s = cached[n].shape;
    bool has_cause = s->cause_attno[0] >= 0 && s->cause_attno[1] >= 0;
    if (!s->plain) {
        *owner = s->owner;
        *cause_columns = has_cause;
        table_close(rel, RowExclusiveLock);
        return false;
    }
    TupleDesc desc = RelationGetDescr(rel);
    Datum* values = static_cast<Datum*>(palloc0(sizeof(Datum) * desc->natts));
    bool* nulls = static_cast<bool*>(palloc(sizeof(bool) * desc->natts));
    for (int a = 0; a < desc->natts; ++a) nulls[a] = true;
    auto set = [&](int c, Datum v) {
        values[s->attno[c]] = v;
        nulls[s->attno[c]] = false;
    };
    // No privilege check on the sequence: EXECUTE on send(), granted by an administrator, is
    // what allows a role to queue a message.
    set(0, Int64GetDatum(next_id(false)));
    set(1, UUIDPGetDatum(message_id));
    set(2, PointerGetDatum(topic));
    if (key) set(3, PointerGetDatum(key));
    if (payload) set(4, PointerGetDatum(payload));
    set(5, headers ? PointerGetDatum(headers) : s->empty_headers);
    set(6, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()));  // now()
    if (cause != nullptr && has_cause) {
        values[s->cause_attno[0]] = PointerGetDatum(cause->subscription);
        nulls[s->cause_attno[0]] = false;
        values[s->cause_attno[1]] = TimestampTzGetDatum(cause->received_at);
        nulls[s->cause_attno[1]] = false;
    }

    // Locks held to the end of the transaction, as the table's (an INSERT releases its index
    // locks at the statement's end; taking them again costs more than keeping them).
    for (int i = 0; i < s->n_indexes; ++i)
        s->info->ri_IndexRelationDescs[i] = index_open(s->index_oids[i], RowExclusiveLock);
    s->info->ri_RelationDesc = rel;
    ResetPerTupleExprContext(s->estate);
    ExecStoreHeapTuple(heap_form_tuple(desc, values, nulls), s->slot, false);
    table_tuple_insert(rel, s->slot, GetCurrentCommandId(true), 0, nullptr);
    List* recheck = ExecInsertIndexTuples(s->info, s->slot, s->estate, false, false, nullptr, NIL);
    list_free(recheck);
    ExecClearTuple(s->slot);
    for (int i = 0; i < s->n_indexes; ++i) {
        index_close(s->info->ri_IndexRelationDescs[i], NoLock);
        s->info->ri_IndexRelationDescs[i] = nullptr;
    }
    s->info->ri_RelationDesc = nullptr;
    table_close(rel, NoLock);  // the lock is held to the end of the transaction, as INSERT does
    if (given_id) check_message_id_elsewhere(message_id, n);
    // What a statement does after an INSERT: later statements of the transaction see the row.
    CommandCounterIncrement();
    return true;
}

}  // namespace eventbox::outbox
