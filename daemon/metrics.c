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
	service_add_counter(r, "downloads_too_slow", srv->downloads_too_slow);
	service_add_counter(r, "restores_cut", srv->restores_cut);
	service_add_counter(r, "delta_publishes", srv->delta_publishes);
	service_add_counter(r, "delta_refused", srv->delta_refused);
	service_add_counter(r, "inflight_waits", srv->busy_pauses);
	service_add_counter(r, "window_bytes", srv->window_bytes);
	service_add_counter(r, "window_waits", srv->window_waits);
	service_add_counter(r, "reported_uses", srv->reported_uses);
	service_add_counter(r, "reported_damaged", srv->reported_damaged);
	service_add_counter(r, "verify_done_bytes", atomic_load(&srv->verify_done));
	service_add_counter(r, "verify_total_bytes", atomic_load(&srv->verify_total));
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

/* What /metrics says of each stat counter: its family name (k3cache_ and
 * this, with Prometheus' unit suffixes), its type and its HELP. A counter
 * not listed here is exported as an "undocumented" gauge, which the
 * daemon_flags_net test refuses: add its row. errors_* and requests_* are
 * one family each, labelled by code and op; pid and uptime_seconds are
 * process_start_time_seconds there. */
struct metric_meta {
	const char *stat, *family;
	int counter;
	const char *help;
};

static const struct metric_meta metric_metas[] = {
        {"entries", "entries", 0, "Entries stored."},
        {"bytes", "stored_bytes", 0,
         "Bytes stored: what the capacity counts (shared blocks once)."},
        {"logical_bytes", "logical_bytes", 0,
         "Bytes of the entries whole, as if nothing were shared."},
        {"blocks", "blocks", 0, "Shared MLA row blocks stored."},
        {"blocks_mismatched", "blocks_mismatched_total", 1,
         "Blocks kept privately because their bytes differed from the stored block."},
        {"models_repaired", "models_repaired_total", 1,
         "Damaged model specs replaced by a put of the same spec, since open."},
        {"indexes_rebuilt", "indexes_rebuilt_total", 1,
         "Times verify rebuilt the indexes, since open."},
        {"row_block", "row_block_rows", 0, "Token rows per shared MLA block."},
        {"max_bytes", "max_bytes", 0, "The store's capacity (--max-bytes)."},
        {"models", "models", 0, "Model specs stored."},
        {"hits", "hits_total", 1, "Lookups that found a stored prefix."},
        {"misses", "misses_total", 1, "Lookups that found none."},
        {"hit_tokens", "hit_tokens_total", 1, "Prompt tokens covered by the prefixes found."},
        {"publishes", "publishes_total", 1, "Entries published."},
        {"publishes_existing", "publishes_existing_total", 1,
         "Publishes of an entry that was stored already."},
        {"restores", "restores_total", 1, "Restores served."},
        {"evictions", "evictions_total", 1, "Entries evicted."},
        {"quarantined", "quarantined_total", 1, "Entries taken out of service as damaged."},
        {"corrupt", "corrupt_total", 1, "Checksum failures found on read."},
        {"map_full_retries", "map_full_retries_total", 1,
         "Writes retried after LMDB's map was full."},
        {"map_size", "map_size_bytes", 0, "Size of LMDB's memory map."},
        {"map_used_pages", "map_used_pages", 0, "Pages of the map in use."},
        {"free_pages", "free_pages", 0, "Pages on LMDB's free list."},
        {"page_size", "page_size_bytes", 0, "LMDB's page size."},
        {"file_bytes", "file_bytes", 0, "Size of the data file."},
        {"chunks", "chunks", 0, "Chunk rows, staged or committed."},
        {"staging", "staging", 0, "Staged publishes in progress."},
        {"staged_swept", "staged_swept_total", 1,
         "Staged publishes a dead process left, removed at open."},
        {"connections_open", "connections_open", 0, "Client connections open."},
        {"connections_accepted", "connections_accepted_total", 1, "Client connections accepted."},
        {"accept_errors", "accept_errors_total", 1, "Connections refused or failed at accept."},
        {"inflight_bytes", "inflight_bytes", 0,
         "Payload and window bytes held for requests in flight (--max-inflight)."},
        {"restores_streaming", "restores_streaming", 0, "Restores being sent now."},
        {"bytes_in", "received_bytes_total", 1, "Bytes read from clients."},
        {"bytes_out", "sent_bytes_total", 1, "Bytes written to clients."},
        {"ingest_yields", "ingest_yields_total", 1, "Upload pauses that let lookups through."},
        {"timeouts", "timeouts_total", 1,
         "Connections closed idle, stalled mid-request or gone while waiting (the rate "
         "limits' closes are counted apart)."},
        {"closed_mid_frame", "closed_mid_frame_total", 1, "Connections that ended mid-frame."},
        {"uploads_too_slow", "uploads_too_slow_total", 1,
         "Uploads closed under --min-upload-rate."},
        {"downloads_too_slow", "downloads_too_slow_total", 1,
         "Connections closed for reading a restore under --min-download-rate."},
        {"restores_cut", "restores_cut_total", 1,
         "Restores ended early because a chunk failed its check after sending began."},
        {"delta_publishes", "delta_publishes_total", 1, "Publishes that sent only new MLA rows."},
        {"delta_refused", "delta_refused_total", 1, "Delta publishes whose base could not serve."},
        {"inflight_waits", "inflight_waits_total", 1,
         "Requests that waited for --max-inflight memory."},
        {"window_bytes", "window_bytes", 0, "Stage memory backing receive windows now."},
        {"window_waits", "window_waits_total", 1,
         "Times an upload waited for its receive window to drain."},
        {"reported_uses", "reported_uses_total", 1,
         "Restores and views reported by direct readers."},
        {"reported_damaged", "reported_damaged_total", 1,
         "Entries reported damaged by direct readers."},
        {"verify_done_bytes", "verify_done_bytes", 0,
         "Bytes of entries the running verify has checked (0: none running)."},
        {"verify_total_bytes", "verify_total_bytes", 0,
         "Bytes of entries the running verify checks in all (0: none running)."},
};

/* The second tier's (t2.h), from its one list. */
static const struct metric_meta t2_metas[] = {
#define T2_META(name, family, help) {"tier2_" #name, family, 1, help},
        K3D_T2_COUNTERS(T2_META)
#undef T2_META
                {"tier2_enabled", "tier2_enabled", 0,
                 "1 when a second tier is configured (--tier2)."},
        {"tier2_used_bytes", "tier2_used_bytes", 0,
         "Bytes of the entries this daemon wrote to the cluster and has not deleted."},
        {"tier2_max_bytes", "tier2_max_bytes", 0,
         "What this daemon may occupy in the cluster (--tier2-max-bytes)."},
};

static const struct metric_meta *metric_meta(const char *stat)
{
	for (size_t i = 0; i < sizeof(metric_metas) / sizeof(metric_metas[0]); i++)
		if (!strcmp(metric_metas[i].stat, stat))
			return &metric_metas[i];
	for (size_t i = 0; i < sizeof(t2_metas) / sizeof(t2_metas[0]); i++)
		if (!strcmp(t2_metas[i].stat, stat))
			return &t2_metas[i];
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
