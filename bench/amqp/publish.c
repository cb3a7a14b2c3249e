/*
 * bench/amqp/publish.c — the baseline publisher of bench section amqp: a plain librabbitmq
 * publisher with publisher confirms, waiting for the broker's acks after every window of
 * messages (bench/README.md, "Targets").
 *
 * Usage: amqp_publish HOST PORT EXCHANGE ROUTING_KEY WINDOW FILE
 *   FILE: one message a line, "key<TAB>message_id<TAB>body" (body without newlines).
 *   ROUTING_KEY "-": each message's key is its routing key.
 * Every message is published persistent (delivery mode 2), mandatory, with message_id and
 * content_type application/json, as the relay publishes it. After WINDOW publishes (and after
 * the last) it waits until the broker acknowledged all of them. Prints "published N seconds S"
 * for the publishing part (connection and file reading left out). Exits 1 on any nack, return
 * or error.
 */
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what) __attribute__((noreturn));
static void die(const char *what) {
  fprintf(stderr, "amqp_publish: %s\n", what);
  exit(1);
}

static void check_rpc(amqp_rpc_reply_t r, const char *what) {
  if (r.reply_type != AMQP_RESPONSE_NORMAL) die(what);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads frames until every publish up to `last` is acknowledged. */
static void wait_confirms(amqp_connection_state_t conn, uint64_t *acked, uint64_t last) {
  while (*acked < last) {
    amqp_frame_t frame;
    amqp_maybe_release_buffers(conn);
    if (amqp_simple_wait_frame(conn, &frame) != AMQP_STATUS_OK) die("connection lost");
    if (frame.frame_type != AMQP_FRAME_METHOD) continue; /* a returned message's content */
    switch (frame.payload.method.id) {
      case AMQP_BASIC_ACK_METHOD: {
        amqp_basic_ack_t *ack = frame.payload.method.decoded;
        if (ack->multiple)
          *acked = ack->delivery_tag;
        else if (ack->delivery_tag == *acked + 1)
          *acked = ack->delivery_tag;
        else
          die("out-of-order single ack (not expected from one channel)");
        break;
      }
      case AMQP_BASIC_NACK_METHOD:
        die("publish nacked by the broker");
      case AMQP_BASIC_RETURN_METHOD:
        die("publish returned as unroutable");
      case AMQP_CHANNEL_CLOSE_METHOD:
        die("channel closed by the broker");
      case AMQP_CONNECTION_CLOSE_METHOD:
        die("connection closed by the broker");
      default:
        break;
    }
  }
}

int main(int argc, char **argv) {
  if (argc != 7) die("usage: amqp_publish HOST PORT EXCHANGE ROUTING_KEY WINDOW FILE");
  const char *host = argv[1], *exchange = argv[3], *fixed_key = argv[4];
  int port = atoi(argv[2]);
  long window = atol(argv[5]);
  if (window < 1) die("WINDOW must be positive");

  FILE *f = fopen(argv[6], "r");
  if (!f) die("cannot open FILE");
  size_t cap = 1024, n = 0;
  char **lines = malloc(cap * sizeof *lines);
  char *line = NULL;
  size_t linecap = 0;
  ssize_t len;
  while ((len = getline(&line, &linecap, f)) > 0) {
    if (line[len - 1] == '\n') line[len - 1] = '\0';
    if (n == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
    lines[n++] = strdup(line);
  }
  fclose(f);
  free(line);

  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t *sock = amqp_tcp_socket_new(conn);
  if (!sock || amqp_socket_open(sock, host, port) != AMQP_STATUS_OK) die("cannot connect");
  check_rpc(amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"),
            "login failed");
  amqp_channel_open(conn, 1);
  check_rpc(amqp_get_rpc_reply(conn), "channel.open failed");
  amqp_confirm_select(conn, 1);
  check_rpc(amqp_get_rpc_reply(conn), "confirm.select failed");

  double t0 = now();
  uint64_t acked = 0;
  for (size_t i = 0; i < n; i++) {
    char *key = lines[i];
    char *mid = strchr(key, '\t');
    if (!mid) die("a line without a tab");
    *mid++ = '\0';
    char *body = strchr(mid, '\t');
    if (!body) die("a line without a second tab");
    *body++ = '\0';
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                   AMQP_BASIC_CONTENT_TYPE_FLAG;
    props.delivery_mode = 2;
    props.message_id = amqp_cstring_bytes(mid);
    props.content_type = amqp_cstring_bytes("application/json");
    int rc = amqp_basic_publish(conn, 1, amqp_cstring_bytes(exchange),
                                amqp_cstring_bytes(strcmp(fixed_key, "-") ? fixed_key : key),
                                1, 0, &props, amqp_cstring_bytes(body));
    if (rc != AMQP_STATUS_OK) die("publish failed");
    if ((i + 1) % window == 0 || i + 1 == n) wait_confirms(conn, &acked, i + 1);
  }
  double elapsed = now() - t0;
  printf("published %zu seconds %.6f\n", n, elapsed);
  amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
  return 0;
}
