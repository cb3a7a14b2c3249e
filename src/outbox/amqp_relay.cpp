// AMQP destinations, PostgreSQL side (see outbox/amqp_relay.hpp).
#include "outbox/amqp_relay.hpp"

extern "C" {
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include <string>
#include <vector>

#include "core/error.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "workers/common.hpp"

namespace eventbox::amqp_relay {

namespace {

// Whether the destinations' table exists: not before the extension's 0.4.0.
bool destinations_exist() {
    int rc =
        SPI_execute("SELECT to_regclass('eventbox.amqp_destination_config') IS NOT NULL", true, 1);
    bool isnull;
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox relay: SPI_execute failed");
    return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

struct LoadedRow {
    char* topic;
    char* exchange;
    char* routing_key;  // nullptr: the message key
};

// Builds the publisher. Without a usable eventbox.amqp_url or amqp_options it refuses every row
// with the reason (Publisher::refuse_all()), which is also logged (no value of the settings
// is shown): the rows stay pending with it in their last_error.
amqp::Publisher* build(const LoadedRow* rows, int n, std::size_t queue_limit, bool* refused) {
    const char* url = guc::amqp_url ? guc::amqp_url : "";
    const char* options = guc::amqp_options ? guc::amqp_options : "";
    char why[512] = "";
    amqp::Publisher* publisher = pg::call_cpp([&] {
        amqp::Settings settings;
        std::string refused;
        if (url[0] == '\0') {
            refused =
                "RabbitMQ is not configured: eventbox.amqp_url is empty (set it and reload "
                "the configuration)";
        } else {
            try {
                amqp::parse_url(url, settings);
                amqp::parse_options(options, settings);
            } catch (const Error& e) {
                refused = std::string("RabbitMQ is not configured: ") + e.what() +
                          " (fix eventbox.amqp_options and restart the server, or "
                          "eventbox.amqp_url and reload)";
            }
        }
        snprintf(why, sizeof why, "%s", refused.c_str());
        std::vector<amqp::Destination> destinations;
        for (int i = 0; i < n; ++i) {
            amqp::Destination d;
            d.topic = rows[i].topic;
            d.exchange = rows[i].exchange;
            d.key_routes = rows[i].routing_key == nullptr;
            if (rows[i].routing_key != nullptr) d.routing_key = rows[i].routing_key;
            destinations.push_back(std::move(d));
        }
        auto* p = new amqp::Publisher(std::move(settings), std::move(destinations), queue_limit);
        if (!refused.empty()) p->refuse_all(std::move(refused));
        return p;
    });
    *refused = why[0] != '\0';
    if (*refused)
        ereport(LOG, (errmsg("eventbox relay: messages for %d AMQP destination(s) wait in the "
                             "outbox: %s",
                             n, why),
                      errhint("Their rows are retried with backoff; last_error in "
                              "eventbox.outbox says why.")));
    return publisher;
}

}  // namespace

char* fingerprint() {
    if (!destinations_exist()) return pstrdup("");
    int rc = SPI_execute(
        "SELECT string_agg(c::text, E'\\n' ORDER BY c.topic) "
        "FROM eventbox.amqp_destination_config c",
        true, 1);
    if (rc != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "eventbox relay: reading AMQP destinations failed: %s",
             SPI_result_code_string(rc));
    bool isnull;
    Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    return isnull ? pstrdup("") : TextDatumGetCString(value);
}

amqp::Publisher* load_publisher(std::size_t queue_limit) {
    MemoryContext load_context =
        AllocSetContextCreate(TopMemoryContext, "eventbox amqp destinations", ALLOCSET_SMALL_SIZES);
    worker::begin_work("eventbox relay");
    int n = 0;
    LoadedRow* rows = nullptr;
    if (destinations_exist()) {
        int rc = SPI_execute(
            "SELECT topic, exchange, routing_key FROM eventbox.amqp_destination_config "
            "ORDER BY topic",
            true, 0);
        if (rc != SPI_OK_SELECT)
            elog(ERROR, "eventbox relay: reading AMQP destinations failed: %s",
                 SPI_result_code_string(rc));
        n = static_cast<int>(SPI_processed);
        MemoryContext spi_context = MemoryContextSwitchTo(load_context);
        rows = static_cast<LoadedRow*>(palloc0(sizeof(LoadedRow) * Max(n, 1)));
        for (int i = 0; i < n; ++i) {
            HeapTuple tuple = SPI_tuptable->vals[i];
            TupleDesc desc = SPI_tuptable->tupdesc;
            bool isnull;
            rows[i].topic = TextDatumGetCString(SPI_getbinval(tuple, desc, 1, &isnull));
            rows[i].exchange = TextDatumGetCString(SPI_getbinval(tuple, desc, 2, &isnull));
            Datum key = SPI_getbinval(tuple, desc, 3, &isnull);
            rows[i].routing_key = isnull ? nullptr : TextDatumGetCString(key);
        }
        MemoryContextSwitchTo(spi_context);
    }
    worker::end_work();
    bool refused = false;
    amqp::Publisher* publisher = n > 0 ? build(rows, n, queue_limit, &refused) : nullptr;
    MemoryContextDelete(load_context);
    if (publisher != nullptr && !refused)
        ereport(LOG, (errmsg("eventbox relay: publishing %d topic(s) to RabbitMQ", n)));
    return publisher;
}

void take_outcomes(amqp::Publisher& publisher, relay::Dispatcher& dispatcher) {
    pg::call_cpp([&] {
        int64_t now = worker::now_ms();
        publisher.poll(now);
        for (const amqp::Outcome& o : publisher.outcomes())
            dispatcher.on_delivery(o.id, o.delivered ? 0 : 1, o.permanent, o.counts, -1, -1,
                                   o.error, now);
        publisher.outcomes().clear();
        publisher.flush();
    });
}

}  // namespace eventbox::amqp_relay
