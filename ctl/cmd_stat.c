/* k3cachectl stat, once (every counter, and the daemon's version)
 * or every N seconds (--interval), a line of rates as redis-cli --stat
 * prints them. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd.h"
#include "frame.h"
#include "units.h"

static int is_size_counter(const char *name)
{
	return !strcmp(name, "bytes") || !strcmp(name, "max_bytes") || !strcmp(name, "map_size") ||
	       !strcmp(name, "file_bytes") || !strcmp(name, "inflight_bytes") ||
	       !strcmp(name, "bytes_in") || !strcmp(name, "bytes_out") ||
	       !strcmp(name, "logical_bytes") || !strcmp(name, "window_bytes") ||
	       (!strncmp(name, "tier2_", 6) && strstr(name, "bytes")); /* the second tier's */
}

/* One Stat request; *resp to free with ctl_response_free(). */
static int fetch(struct ctl_backend *b, frame_response **resp)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Stat st = K3CACHE__V1__STAT__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_STAT;
	req.stat = &st;
	return ctl_call_ok(b, &req, resp, "stat");
}

static void print_all(const frame_response *resp, int json)
{
	if (json) {
		json_t *doc = json_object();
		if (resp->server && *resp->server) /* a daemon's, not --db */
			json_object_set_new(doc, "version", json_string(resp->server));
		for (size_t i = 0; i < resp->n_counters; i++)
			json_object_set_new(doc, resp->counters[i]->name,
			                    json_integer((json_int_t)resp->counters[i]->value));
		ctl_print_json(stdout, doc);
		return;
	}
	/* one column for the values, past the longest name */
	int w = 24;
	for (size_t i = 0; i < resp->n_counters; i++) {
		size_t len = strlen(resp->counters[i]->name);
		if (len > (size_t)w && len < 64)
			w = (int)len;
	}
	if (resp->server && *resp->server)
		printf("%-*s %16s\n", w, "version", resp->server);
	for (size_t i = 0; i < resp->n_counters; i++) {
		const K3cache__V1__Counter *c = resp->counters[i];
		char human[32] = "";
		if (is_size_counter(c->name))
			ctl_size(c->value, human, sizeof(human));
		printf("%-*s %16" PRIu64 "  %s\n", w, c->name, c->value, human);
	}
	uint64_t hits = ctl_counter(resp, "hits"), misses = ctl_counter(resp, "misses");
	if (hits + misses)
		printf("%-*s %15.1f%%\n", w, "hit_ratio",
		       100.0 * (double)hits / (double)(hits + misses));
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Every `interval` seconds, a line: the store's size, then the rates since
 * the line before (the first line: since the daemon started). JSON: one
 * object a line. */
static int repeat(struct ctl_backend *b, double interval, long count, int json)
{
	static const char *const rates[] = {"hits",     "misses",   "publishes",
	                                    "restores", "bytes_in", "bytes_out"};
	enum { N_RATES = sizeof(rates) / sizeof(rates[0]) };
	uint64_t last[N_RATES] = {0};
	double t_last = 0;
	for (long line = 0; count <= 0 || line < count; line++) {
		if (line > 0) {
			struct timespec ts = {(time_t)interval,
			                      (long)((interval - (double)(time_t)interval) * 1e9)};
			while (nanosleep(&ts, &ts) != 0) {
			}
		}
		frame_response *r;
		int rc = fetch(b, &r);
		if (rc)
			return rc;
		double t = now();
		double span = line ? t - t_last : (double)ctl_counter(r, "uptime_seconds");
		if (span <= 0)
			span = 1;
		double rate[N_RATES];
		for (int i = 0; i < N_RATES; i++) {
			uint64_t v = ctl_counter(r, rates[i]);
			rate[i] = (double)(v - (line ? last[i] : 0)) / span;
			last[i] = v;
		}
		t_last = t;
		char stored[32], in[32], out[32];
		ctl_size(ctl_counter(r, "bytes"), stored, sizeof(stored));
		ctl_size((uint64_t)rate[4], in, sizeof(in));
		ctl_size((uint64_t)rate[5], out, sizeof(out));
		if (json) {
			printf("{\"entries\": %" PRIu64 ", \"bytes\": %" PRIu64
			       ", \"connections\": %" PRIu64
			       ", \"hits_per_s\": %.1f, \"misses_per_s\": %.1f, "
			       "\"publishes_per_s\": "
			       "%.1f, \"restores_per_s\": %.1f, \"bytes_in_per_s\": %.0f, "
			       "\"bytes_out_per_s\": %.0f}\n",
			       ctl_counter(r, "entries"), ctl_counter(r, "bytes"),
			       ctl_counter(r, "connections_open"), rate[0], rate[1], rate[2],
			       rate[3], rate[4], rate[5]);
		} else {
			if (line % 20 == 0)
				printf("%8s %10s %5s %9s %9s %9s %9s %10s %10s\n", "entries",
				       "stored", "conns", "hits/s", "misses/s", "publish/s",
				       "restore/s", "in/s", "out/s");
			printf("%8" PRIu64 " %10s %5" PRIu64 " %9.1f %9.1f %9.1f %9.1f %10s %10s\n",
			       ctl_counter(r, "entries"), stored,
			       ctl_counter(r, "connections_open"), rate[0], rate[1], rate[2],
			       rate[3], in, out);
		}
		fflush(stdout);
		ctl_response_free(b, r);
	}
	return 0;
}

/* --interval: a duration as the other flags take one (units.h), to the
 * millisecond; a bare number is seconds ("0.5"), a unit may follow ("2s",
 * "500ms", "1.5m"). 0, or -1 for anything else (a sign, a space, an
 * exponent, hex). */
static int parse_interval(const char *s, uint64_t *ms)
{
	size_t n = strlen(s);
	char buf[64];
	if (n && n < sizeof(buf) - 1 && (s[n - 1] == '.' || (s[n - 1] >= '0' && s[n - 1] <= '9'))) {
		snprintf(buf, sizeof(buf), "%ss", s); /* bare seconds */
		s = buf;
	}
	return units_parse_ms(s, ms);
}

static int cmd_stat_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                         char **argv)
{
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
	                                     {"interval", required_argument, NULL, 'i'},
	                                     {"count", required_argument, NULL, 'c'},
	                                     {NULL, 0, NULL, 0}};
	int json = g->json, c;
	double interval = 0;
	long count = 0;
	uint64_t v;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			json = 1;
			break;
		case 'i':
			if (parse_interval(optarg, &v) || v < 100 || v > 86400000)
				return ctl_cmd_usage_error(self,
				                           "--interval: seconds (0.5, 2s, 500ms), "
				                           "from 0.1 to 86400");
			interval = (double)v / 1000.0;
			break;
		case 'c':
			if (units_parse_uint(optarg, 1, UINT32_MAX, &v))
				return ctl_cmd_usage_error(
				        self, "--count: a number of lines, at least 1");
			count = (long)v;
			break;
		default:
			return ctl_cmd_option_error(self, argv, opts, "");
		}
	}
	if (optind != argc)
		return ctl_cmd_usage_error(self, "unexpected argument");
	if (count && !interval)
		return ctl_cmd_usage_error(self, "--count goes with --interval");
	if (interval && g->db)
		return ctl_cmd_usage_error(self, "--interval needs a daemon, not --db");
	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, self->name);
	if (rc)
		return rc;
	if (interval) {
		rc = repeat(&b, interval, count, json);
	} else {
		frame_response *r;
		if ((rc = fetch(&b, &r)) == 0) {
			print_all(r, json);
			ctl_response_free(&b, r);
		}
	}
	ctl_backend_close(&b);
	return rc;
}

const struct ctl_cmd_entry ctl_cmd_stat_entry = {
        .name = "stat",
        .usage = "[--interval SECONDS [--count N]]",
        .help = "everything the daemon counts\n"
                "Prints everything the daemon counts: its version, pid and uptime,\n"
                "entries, bytes, hits, misses, publishes, evictions, errors by code,\n"
                "connections, the map. With --interval, a line every SECONDS (the\n"
                "store's size, then rates since the line before; the first since the\n"
                "daemon started), as redis-cli --stat; --count stops after N lines.\n"
                "--interval needs the daemon.\n",
        .flags = CTL_CMD_DAEMON | CTL_CMD_DB,
        .exec = cmd_stat_exec,
};
