/* metrics: the counters that `k3cachectl stat` and Prometheus (/metrics over
 * evhttp) show, and request latency histograms. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>

#include "daemon.h"
#include "service.h"

static const double bucket_bounds[K3D_N_BUCKETS] = {0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                    0.025,  0.05,   0.1,   0.5,    1.0,   5.0};

void k3d_metrics_observe(struct k3d_server *srv, int op, double seconds)
{
	struct k3d_hist *h = &srv->latency[op];
	int b = 0;
	while (b < K3D_N_BUCKETS && seconds > bucket_bounds[b])
		b++;
	h->counts[b]++;
	h->n++;
	h->sum += seconds;
}

/* The daemon's own counters, in the order stat sends them after the store's:
 * X(name, Prometheus family (k3cache_ and this, with its unit suffix),
 * 1 counter / 0 gauge, HELP, value read from srv).
 * With SERVICE_STORE_COUNTERS and t2.h's lists, the one list of what stat
 * sends and /metrics shows. errors_* and requests_* are one family each,
 * labelled by code and op; pid and uptime_seconds are
 * process_start_time_seconds there. */
#define K3D_DAEMON_COUNTERS(X)                                                                     \
	X("connections_open", "connections_open", 0, "Client connections open.",                   \
	  srv->connections_open)                                                                   \
	X("connections_accepted", "connections_accepted_total", 1, "Client connections accepted.", \
	  srv->connections_total)                                                                  \
	X("accept_errors", "accept_errors_total", 1, "Connections refused or failed at accept.",   \
	  srv->connections_refused)                                                                \
	X("inflight_bytes", "inflight_bytes", 0,                                                   \
	  "Payload and window bytes held for requests in flight (--max-inflight).",                \
	  srv->inflight_bytes)                                                                     \
	X("max_restores", "max_restores", 0, "Restores that may stream at once (--max-restores).", \
	  srv->cfg.max_restores)                                                                   \
	X("max_restores_per_tenant", "max_restores_per_tenant", 0,                                 \
	  "Of those, what one tenant may hold (--max-restores-per-tenant).",                       \
	  srv->cfg.max_restores_per_tenant)                                                        \
	X("restores_streaming", "restores_streaming", 0, "Restores being sent now.",               \
	  srv->restores_active)                                                                    \
	X("bytes_in", "received_bytes_total", 1, "Bytes read from clients.", srv->bytes_in)        \
	X("bytes_out", "sent_bytes_total", 1, "Bytes written to clients.", srv->bytes_out)         \
	X("ingest_yields", "ingest_yields_total", 1, "Upload pauses that let lookups through.",    \
	  srv->ingest_yields)                                                                      \
	X("timeouts", "timeouts_total", 1,                                                         \
	  "Connections closed idle, stalled mid-request or gone while waiting (the rate "          \
	  "limits' closes are counted apart).",                                                    \
	  srv->timeouts)                                                                           \
	X("closed_mid_frame", "closed_mid_frame_total", 1, "Connections that ended mid-frame.",    \
	  srv->closed_mid_frame)                                                                   \
	X("uploads_too_slow", "uploads_too_slow_total", 1,                                         \
	  "Uploads closed under --min-upload-rate.", srv->uploads_too_slow)                        \
	X("downloads_too_slow", "downloads_too_slow_total", 1,                                     \
	  "Connections closed for reading a restore under --min-download-rate.",                   \
	  srv->downloads_too_slow)                                                                 \
	X("restores_tenant_busy", "restores_tenant_busy_total", 1,                                 \
	  "Restores answered BUSY because their tenant held its --max-restores-per-tenant.",       \
	  srv->restores_tenant_busy)                                                               \
	X("restores_cut", "restores_cut_total", 1,                                                 \
	  "Restores ended early because a chunk failed its check after sending began.",            \
	  srv->restores_cut)                                                                       \
	X("delta_publishes", "delta_publishes_total", 1, "Publishes that sent only new MLA rows.", \
	  srv->delta_publishes)                                                                    \
	X("delta_refused", "delta_refused_total", 1,                                               \
	  "Delta publishes whose base could not serve.", srv->delta_refused)                       \
	X("inflight_waits", "inflight_waits_total", 1,                                             \
	  "Requests that waited for --max-inflight memory.", srv->busy_pauses)                     \
	X("header_bytes", "header_bytes", 0,                                                       \
	  "Large request headers and their decoded tokens, charged to --max-inflight.",            \
	  srv->header_bytes)                                                                       \
	X("window_bytes", "window_bytes", 0, "Stage memory backing receive windows now.",          \
	  srv->window_bytes)                                                                       \
	X("window_waits", "window_waits_total", 1,                                                 \
	  "Times an upload waited for its receive window to drain.", srv->window_waits)            \
	X("reported_uses", "reported_uses_total", 1,                                               \
	  "Restores and views reported by direct readers.", srv->reported_uses)                    \
	X("reported_damaged", "reported_damaged_total", 1,                                         \
	  "Entries reported damaged by direct readers.", srv->reported_damaged)                    \
	X("reports_dropped", "reports_dropped_total", 1,                                           \
	  "Damage reports not checked: as many checks were queued already, or no memory.",         \
	  srv->reports_dropped)                                                                    \
	X("verify_done_bytes", "verify_done_bytes", 0,                                             \
	  "Bytes of entries the running verify has checked (0: none running).",                    \
	  atomic_load(&srv->verify_done))                                                          \
	X("verify_total_bytes", "verify_total_bytes", 0,                                           \
	  "Bytes of entries the running verify checks in all (0: none running).",                  \
	  atomic_load(&srv->verify_total))                                                         \
	X("tier2_enabled", "tier2_enabled", 0, "1 when a second tier is configured (--tier2).",    \
	  srv->t2 != NULL)

void k3d_fill_counters(struct k3d_server *srv, frame_response *r)
{
	r->server = (char *)K3D_VERSION; /* static: not freed with the response */
	service_add_counter(r, "pid", (uint64_t)getpid());
	service_add_counter(r, "uptime_seconds", (uint64_t)(k3d_now() - srv->started));
	service_store_counters(srv->store, r);
#define DAEMON_ADD(name, family, counter, help, value)                                             \
	service_add_counter(r, name, (uint64_t)(value));
	K3D_DAEMON_COUNTERS(DAEMON_ADD)
#undef DAEMON_ADD
	k3d_t2_counters(srv, r);
	for (int code = 1; code < STATUS_N_CODES; code++) {
		char name[64];
		snprintf(name, sizeof(name), "errors_%s", status_code_name((enum status_code)code));
		for (char *p = name; *p; p++)
			*p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
		service_add_counter(r, name, srv->errors[code]);
	}
	for (int op = 0; op < OPS_N; op++) {
		char name[64];
		snprintf(name, sizeof(name), "requests_%s", ops_table[op].name);
		service_add_counter(r, name, srv->requests[op]);
	}
}

/* What /metrics says of each stat counter, from the lists above. A counter
 * not found here is exported as an "undocumented" gauge, which the
 * daemon_flags_net test refuses. */
struct metric_meta {
	const char *stat, *family;
	int counter;
	const char *help;
};

/* one block per list (clang-format would indent each further) */
/* clang-format off */
static const struct metric_meta metric_metas[] = {
#define STORE_META(name, field, family, counter, help) {name, family, counter, help},
	SERVICE_STORE_COUNTERS(STORE_META)
#undef STORE_META
#define DAEMON_META(name, family, counter, help, value) {name, family, counter, help},
	K3D_DAEMON_COUNTERS(DAEMON_META)
#undef DAEMON_META
#define T2_META(name, family, help) {"tier2_" #name, family, 1, help},
	K3D_T2_COUNTERS(T2_META)
#undef T2_META
#define T2_GAUGE_META(name, family, help, value) {"tier2_" #name, family, 0, help},
	K3D_T2_GAUGES(T2_GAUGE_META)
#undef T2_GAUGE_META
};
/* clang-format on */

static const struct metric_meta *metric_meta(const char *stat)
{
	for (size_t i = 0; i < sizeof(metric_metas) / sizeof(metric_metas[0]); i++)
		if (!strcmp(metric_metas[i].stat, stat))
			return &metric_metas[i];
	return NULL;
}

/* The counters of one labelled family (errors_*, requests_*): one HELP and
 * TYPE, a sample per label value. */
static void labelled(struct evbuffer *b, const frame_response *r, const char *prefix,
                     const char *family, const char *label, const char *help)
{
	size_t n = strlen(prefix);
	evbuffer_add_printf(b, "# HELP k3cache_%s %s\n# TYPE k3cache_%s counter\n", family, help,
	                    family);
	for (size_t i = 0; i < r->n_counters; i++)
		if (!strncmp(r->counters[i]->name, prefix, n))
			evbuffer_add_printf(b, "k3cache_%s{%s=\"%s\"} %llu\n", family, label,
			                    r->counters[i]->name + n,
			                    (unsigned long long)r->counters[i]->value);
}

static void on_metrics(struct evhttp_request *req, void *arg)
{
	struct k3d_server *srv = arg;
	struct evbuffer *b = evbuffer_new();
	if (!b) {
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	k3d_fill_counters(srv, &r);
	evbuffer_add_printf(b,
	                    "# HELP k3cache_build_info The daemon's version.\n"
	                    "# TYPE k3cache_build_info gauge\n"
	                    "k3cache_build_info{version=\"%s\"} 1\n",
	                    K3_VERSION);
	struct timespec wall;
	clock_gettime(CLOCK_REALTIME, &wall);
	evbuffer_add_printf(b,
	                    "# HELP process_start_time_seconds Start time of the process since "
	                    "unix epoch in seconds.\n"
	                    "# TYPE process_start_time_seconds gauge\n"
	                    "process_start_time_seconds %.3f\n",
	                    (double)wall.tv_sec + (double)wall.tv_nsec * 1e-9 -
	                            (k3d_now() - srv->started));
	for (size_t i = 0; i < r.n_counters; i++) {
		const char *name = r.counters[i]->name;
		if (!strncmp(name, "errors_", 7) || !strncmp(name, "requests_", 9) ||
		    !strcmp(name, "pid") || !strcmp(name, "uptime_seconds"))
			continue;
		const struct metric_meta *mm = metric_meta(name);
		const char *family = mm ? mm->family : name;
		evbuffer_add_printf(b,
		                    "# HELP k3cache_%s %s\n# TYPE k3cache_%s %s\nk3cache_%s %llu\n",
		                    family, mm ? mm->help : "undocumented", family,
		                    mm && mm->counter ? "counter" : "gauge", family,
		                    (unsigned long long)r.counters[i]->value);
	}
	labelled(b, &r, "errors_", "errors_total", "code", "Error answers, by code.");
	labelled(b, &r, "requests_", "requests_total", "op", "Requests, by op.");
	service_response_clear(&r);
	evbuffer_add_printf(b, "# HELP k3cache_request_seconds Time from a request's header to "
	                       "its answer, by op.\n"
	                       "# TYPE k3cache_request_seconds histogram\n");
	for (int op = 0; op < OPS_N; op++) { /* every op's series, from the start */
		const struct k3d_hist *h = &srv->latency[op];
		uint64_t cum = 0;
		for (int i = 0; i < K3D_N_BUCKETS; i++) {
			cum += h->counts[i];
			evbuffer_add_printf(
			        b, "k3cache_request_seconds_bucket{op=\"%s\",le=\"%g\"} %llu\n",
			        ops_table[op].name, bucket_bounds[i], (unsigned long long)cum);
		}
		cum += h->counts[K3D_N_BUCKETS];
		evbuffer_add_printf(b,
		                    "k3cache_request_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n",
		                    ops_table[op].name, (unsigned long long)cum);
		evbuffer_add_printf(b, "k3cache_request_seconds_sum{op=\"%s\"} %.6f\n",
		                    ops_table[op].name, h->sum);
		evbuffer_add_printf(b, "k3cache_request_seconds_count{op=\"%s\"} %llu\n",
		                    ops_table[op].name, (unsigned long long)h->n);
	}
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
	                  "text/plain; version=0.0.4");
	evhttp_send_reply(req, 200, "OK", b);
	evbuffer_free(b);
}

int k3d_metrics_start(struct k3d_server *srv)
{
	const struct k3d_addr *a = &srv->cfg.metrics;
	srv->http = evhttp_new(srv->base);
	if (!srv->http)
		return -1;
	evhttp_set_cb(srv->http, "/metrics", on_metrics, srv);
	/* evhttp takes the listener (and frees it with srv->http) */
	struct evconnlistener *l = evconnlistener_new_bind(
	        srv->base, NULL, NULL,
	        LEV_OPT_CLOSE_ON_EXEC | LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 128,
	        (const struct sockaddr *)&a->sa, a->len);
	if (!l) {
		k3d_log(K3D_LOG_ERROR, "--metrics %s: %s", a->text, strerror(errno));
		return -1;
	}
	if (!evhttp_bind_listener(srv->http, l)) {
		evconnlistener_free(l);
		k3d_log(K3D_LOG_ERROR, "--metrics %s: out of memory", a->text);
		return -1;
	}
	char bound[64];
	k3d_bound_address(evconnlistener_get_fd(l), bound, sizeof(bound));
	snprintf(srv->metrics_bound, sizeof(srv->metrics_bound), "http://%s/metrics", bound);
	return 0;
}
