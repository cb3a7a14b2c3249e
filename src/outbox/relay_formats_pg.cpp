// The relay's topic formats on the PostgreSQL side: eventbox.topic_formats read at each reset
// into the relay::FormatSink in front of Kafka (see outbox/relay_formats.hpp). The table's
// changes move the relay's route generation and its fingerprint (outbox/http_relay.cpp), so a
// row committed after set_topic_format() is never encoded by the configuration before it.
#include "outbox/relay_worker.hpp"

extern "C" {
#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "workers/common.hpp"

namespace eventbox::relay_worker {

namespace {

struct LoadedFormat {
    char* topic;
    char* value_subject;  // "": none
    int value_version;
    char* key_subject;
    int key_version;
};

// The last load's rows, in their own memory context.
MemoryContext formats_context = nullptr;
LoadedFormat* loaded = nullptr;
int n_loaded = 0;

}  // namespace

void PgDispatcher::load_formats() {
    if (formats_context == nullptr)
        formats_context =
            AllocSetContextCreate(TopMemoryContext, "eventbox topic formats", ALLOCSET_SMALL_SIZES);
    MemoryContextReset(formats_context);
    loaded = nullptr;
    n_loaded = 0;
    worker::begin_work(kWho);
    int rc = SPI_execute("SELECT to_regclass('eventbox.topic_formats') IS NOT NULL", true, 1);
    bool isnull;
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox relay: SPI_execute failed");
    bool exists =
        DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    if (exists) {
        rc = SPI_execute(
            "SELECT topic, coalesce(value_subject, ''), coalesce(value_version, 0), "
            "coalesce(key_subject, ''), coalesce(key_version, 0) FROM eventbox.topic_formats "
            "ORDER BY topic",
            true, 0);
        if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox relay: reading topic formats failed");
        MemoryContext old = MemoryContextSwitchTo(formats_context);
        n_loaded = static_cast<int>(SPI_processed);
        loaded = static_cast<LoadedFormat*>(palloc0(sizeof(LoadedFormat) * Max(n_loaded, 1)));
        for (int i = 0; i < n_loaded; ++i) {
            HeapTuple tuple = SPI_tuptable->vals[i];
            TupleDesc desc = SPI_tuptable->tupdesc;
            loaded[i].topic = TextDatumGetCString(SPI_getbinval(tuple, desc, 1, &isnull));
            loaded[i].value_subject = TextDatumGetCString(SPI_getbinval(tuple, desc, 2, &isnull));
            loaded[i].value_version = DatumGetInt32(SPI_getbinval(tuple, desc, 3, &isnull));
            loaded[i].key_subject = TextDatumGetCString(SPI_getbinval(tuple, desc, 4, &isnull));
            loaded[i].key_version = DatumGetInt32(SPI_getbinval(tuple, desc, 5, &isnull));
        }
        MemoryContextSwitchTo(old);
    }
    worker::end_work();
}

relay::Sink* PgDispatcher::with_formats(relay::Sink* kafka) {
    if (n_loaded == 0) return kafka;
    std::vector<relay::TopicFormat> formats;
    for (int i = 0; i < n_loaded; ++i)
        formats.push_back(relay::TopicFormat{loaded[i].topic, loaded[i].value_subject,
                                             loaded[i].value_version, loaded[i].key_subject,
                                             loaded[i].key_version});
    registry::Config config =
        registry::make_config(guc::schema_registry_url ? guc::schema_registry_url : "",
                              guc::schema_registry_options ? guc::schema_registry_options : "");
    formats_ = new relay::FormatSink(*kafka, std::move(config), std::move(formats),
                                     [] { return worker::now_ms(); });
    return formats_;
}

void PgDispatcher::serve_formats() {
    if (formats_ != nullptr) pg::call_cpp([&] { formats_->perform(); });
}

}  // namespace eventbox::relay_worker
