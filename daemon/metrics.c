/* metrics: the counters that `k3cachectl stat` and Prometheus (/metrics over
 * evhttp) show, and request latency histograms. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "daemon.h"
#include "service.h"

static const char *const op_names[K3D_N_OPS] = {
        "hello", "put_model", "publish",     "lookup", "restore", "list",   "inspect",
        "evict", "stat",      "list_models", "verify", "resolve", "report", "unknown"};

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

void k3d_fill_counters(struct k3d_server *srv, frame_response *r)
{
	r->server = (char *)K3D_VERSION; /* static: not freed with the response */
	service_add_counter(r, "pid", (uint64_t)getpid());
	service_add_counter(r, "uptime_seconds", (uint64_t)(k3d_now() - srv->started));
	service_store_counters(srv->store, r);
	service_add_counter(r, "connections_open", srv->connections_open);
	service_add_counter(r, "connections_accepted", srv->connections_total);
	service_add_counter(r, "accept_errors", srv->connections_refused);
	service_add_counter(r, "inflight_bytes", srv->inflight_bytes);
	service_add_counter(r, "restores_streaming", srv->restores_active);
	service_add_counter(r, "bytes_in", srv->bytes_in);
	service_add_counter(r, "bytes_out", srv->bytes_out);
	service_add_counter(r, "ingest_yields", srv->ingest_yields);
	service_add_counter(r, "timeouts", srv->timeouts);
	service_add_counter(r, "closed_mid_frame", srv->closed_mid_frame);
	service_add_counter(r, "uploads_too_slow", srv->uploads_too_slow);
	service_add_counter(r, "restores_cut", srv->restores_cut);
	service_add_counter(r, "delta_publishes", srv->delta_publishes);
	service_add_counter(r, "delta_refused", srv->delta_refused);
	service_add_counter(r, "inflight_waits", srv->busy_pauses);
	service_add_counter(r, "window_bytes", srv->window_bytes);
	service_add_counter(r, "window_waits", srv->window_waits);
	service_add_counter(r, "reported_uses", srv->reported_uses);
	service_add_counter(r, "reported_damaged", srv->reported_damaged);
	for (int code = 1; code < STATUS_N_CODES; code++) {
		char name[64];
		snprintf(name, sizeof(name), "errors_%s", status_code_name((enum status_code)code));
		for (char *p = name; *p; p++)
			*p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
		service_add_counter(r, name, srv->errors[code]);
	}
	for (int op = 0; op < K3D_N_OPS; op++) {
		char name[64];
		snprintf(name, sizeof(name), "requests_%s", op_names[op]);
		service_add_counter(r, name, srv->requests[op]);
	}
}

static int is_counter(const char *name)
{
	static const char *const gauges[] = {"entries",
	                                     "bytes",
	                                     "max_bytes",
	                                     "models",
	                                     "map_size",
	                                     "map_used_pages",
	                                     "free_pages",
	                                     "page_size",
	                                     "file_bytes",
	                                     "connections_open",
	                                     "inflight_bytes",
	                                     "restores_streaming",
	                                     "chunks",
	                                     "staging",
	                                     "logical_bytes",
	                                     "blocks",
	                                     "row_block",
	                                     "window_bytes",
	                                     "pid",
	                                     "uptime_seconds"};
	for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++)
		if (!strcmp(gauges[i], name))
			return 0;
	return 1;
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
	for (size_t i = 0; i < r.n_counters; i++) {
		const char *name = r.counters[i]->name;
		int counter = is_counter(name);
		evbuffer_add_printf(b, "# TYPE k3cache_%s%s %s\nk3cache_%s%s %llu\n", name,
		                    counter ? "_total" : "", counter ? "counter" : "gauge", name,
		                    counter ? "_total" : "",
		                    (unsigned long long)r.counters[i]->value);
	}
	service_response_clear(&r);
	evbuffer_add_printf(b, "# TYPE k3cache_request_seconds histogram\n");
	for (int op = 0; op < K3D_N_OPS; op++) {
		const struct k3d_hist *h = &srv->latency[op];
		if (!h->n)
			continue;
		uint64_t cum = 0;
		for (int i = 0; i < K3D_N_BUCKETS; i++) {
			cum += h->counts[i];
			evbuffer_add_printf(
			        b, "k3cache_request_seconds_bucket{op=\"%s\",le=\"%g\"} %llu\n",
			        op_names[op], bucket_bounds[i], (unsigned long long)cum);
		}
		cum += h->counts[K3D_N_BUCKETS];
		evbuffer_add_printf(b,
		                    "k3cache_request_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n",
		                    op_names[op], (unsigned long long)cum);
		evbuffer_add_printf(b, "k3cache_request_seconds_sum{op=\"%s\"} %.6f\n",
		                    op_names[op], h->sum);
		evbuffer_add_printf(b, "k3cache_request_seconds_count{op=\"%s\"} %llu\n",
		                    op_names[op], (unsigned long long)h->n);
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
