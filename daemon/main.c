/* k3cached: the k3cache daemon. Runs in the foreground, logs to stderr, stops
 * cleanly on SIGTERM/SIGINT. */
#include <getopt.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "paths.h"
#include "units.h"

static void usage(FILE *f, const char *db, const char *sock)
{
	fprintf(f,
	        "usage: k3cached [--db DIR] [--socket PATH] [options]\n"
	        "\n"
	        "A prefix-cache daemon with a persistent LMDB store of KDA/MLA layer state.\n"
	        "\n"
	        "  --db DIR              store directory (default %s)\n"
	        "  --socket PATH         Unix socket, mode 0660 (default %s)\n"
	        "  --listen HOST:PORT    also listen on TCP (HOST defaults to 127.0.0.1)\n"
	        "  --max-bytes SIZE      capacity for snapshot bytes; LRU eviction past it\n"
	        "                        (default 1GiB)\n"
	        "  --durability MODE     safe (default: a power loss may drop the last commit),\n"
	        "                        strict (sync every commit), fast (sync every\n"
	        "                        --sync-interval; survives process crashes)\n"
	        "  --max-payload SIZE    largest publish payload accepted (default 2GiB)\n"
	        "  --max-inflight SIZE   payload bytes held for publishes at once; past it,\n"
	        "                        connections wait (default 2GiB)\n"
	        "  --max-restores N      restores streaming at once; past it BUSY (default 64)\n"
	        "  --stage-size SIZE     a publish larger than this is written as it arrives,\n"
	        "                        a stage of this size per commit (default 32MiB)\n"
	        "  --yield-rate SIZE     while lookups arrive, read each publish upload at\n"
	        "                        most SIZE per second, so that uploads do not crowd\n"
	        "                        lookups off the CPU (default 1GiB; 0: no limit)\n"
	        "  --idle-timeout DUR    close connections idle this long (default 300s)\n"
	        "  --stall-timeout DUR   close connections stalled mid-frame or mid-reply\n"
	        "                        this long (default 30s)\n"
	        "  --sync-interval DUR   with --durability fast (default 1s)\n"
	        "  --metrics HOST:PORT   serve Prometheus text at http://HOST:PORT/metrics\n"
	        "  --log-level LEVEL     error, warn, info (default) or debug\n"
	        "  --help                this text\n"
	        "\n"
	        "SIZE takes K/M/G/T or KiB/MiB/GiB/TiB; DUR takes s/m/h/d.\n",
	        db, sock);
}

static int bad(const char *flag, const char *val, const char *want)
{
	fprintf(stderr, "k3cached: %s %s: expected %s\n", flag, val, want);
	return 2;
}

int main(int argc, char **argv)
{
	static char dbbuf[4096], sockbuf[4096];
	struct k3d_config cfg = {
	        .db = paths_default_db(dbbuf, sizeof(dbbuf)),
	        .socket = paths_default_socket(sockbuf, sizeof(sockbuf)),
	        .max_bytes = 1ull << 30,
	        .max_payload = 2ull << 30,
	        .max_inflight = 2ull << 30,
	        .yield_rate = 1ull << 30,
	        .max_restores = 64,
	        .idle_timeout = 300,
	        .stall_timeout = 30,
	        .sync_interval = 1,
	        .durability = STORE_SAFE,
	        .log_level = K3D_LOG_INFO,
	};
	enum {
		O_DB = 1,
		O_SOCK,
		O_LISTEN,
		O_MAXB,
		O_DUR,
		O_METRICS,
		O_MAXP,
		O_INFL,
		O_STAGE,
		O_YIELD,
		O_MAXR,
		O_IDLE,
		O_STALL,
		O_SYNC,
		O_LOG,
		O_HELP
	};
	static const struct option opts[] = {
	        {"db", required_argument, NULL, O_DB},
	        {"socket", required_argument, NULL, O_SOCK},
	        {"listen", required_argument, NULL, O_LISTEN},
	        {"max-bytes", required_argument, NULL, O_MAXB},
	        {"durability", required_argument, NULL, O_DUR},
	        {"metrics", required_argument, NULL, O_METRICS},
	        {"max-payload", required_argument, NULL, O_MAXP},
	        {"max-inflight", required_argument, NULL, O_INFL},
	        {"stage-size", required_argument, NULL, O_STAGE},
	        {"yield-rate", required_argument, NULL, O_YIELD},
	        {"max-restores", required_argument, NULL, O_MAXR},
	        {"idle-timeout", required_argument, NULL, O_IDLE},
	        {"stall-timeout", required_argument, NULL, O_STALL},
	        {"sync-interval", required_argument, NULL, O_SYNC},
	        {"log-level", required_argument, NULL, O_LOG},
	        {"help", no_argument, NULL, O_HELP},
	        {NULL, 0, NULL, 0},
	};
	int c;
	uint64_t v;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_DB:
			cfg.db = optarg;
			break;
		case O_SOCK:
			cfg.socket = optarg;
			break;
		case O_LISTEN:
			cfg.listen = optarg;
			break;
		case O_METRICS:
			cfg.metrics = optarg;
			break;
		case O_MAXB:
			if (units_parse_size(optarg, &cfg.max_bytes) || cfg.max_bytes == 0)
				return bad("--max-bytes", optarg, "a size such as 64GiB");
			break;
		case O_MAXP:
			if (units_parse_size(optarg, &cfg.max_payload) || cfg.max_payload == 0)
				return bad("--max-payload", optarg, "a size such as 1GiB");
			break;
		case O_STAGE:
			if (units_parse_size(optarg, &cfg.stage_bytes) || cfg.stage_bytes == 0)
				return bad("--stage-size", optarg, "a size such as 32MiB");
			break;
		case O_YIELD:
			if (units_parse_size(optarg, &cfg.yield_rate))
				return bad("--yield-rate", optarg,
				           "a size per second such as 1GiB, or 0");
			break;
		case O_INFL:
			if (units_parse_size(optarg, &cfg.max_inflight) || cfg.max_inflight == 0)
				return bad("--max-inflight", optarg, "a size such as 2GiB");
			break;
		case O_MAXR:
			if (units_parse_size(optarg, &v) || v == 0 || v > 100000)
				return bad("--max-restores", optarg, "a number from 1 to 100000");
			cfg.max_restores = (uint32_t)v;
			break;
		case O_IDLE:
			if (units_parse_duration(optarg, &cfg.idle_timeout) || !cfg.idle_timeout)
				return bad("--idle-timeout", optarg, "a duration such as 5m");
			break;
		case O_STALL:
			if (units_parse_duration(optarg, &cfg.stall_timeout) || !cfg.stall_timeout)
				return bad("--stall-timeout", optarg, "a duration such as 30s");
			break;
		case O_SYNC:
			if (units_parse_duration(optarg, &cfg.sync_interval) || !cfg.sync_interval)
				return bad("--sync-interval", optarg, "a duration such as 1s");
			break;
		case O_DUR:
			if (store_durability_parse(optarg, &cfg.durability))
				return bad("--durability", optarg, "safe, strict or fast");
			break;
		case O_LOG:
			if (!strcmp(optarg, "error"))
				cfg.log_level = K3D_LOG_ERROR;
			else if (!strcmp(optarg, "warn"))
				cfg.log_level = K3D_LOG_WARN;
			else if (!strcmp(optarg, "info"))
				cfg.log_level = K3D_LOG_INFO;
			else if (!strcmp(optarg, "debug"))
				cfg.log_level = K3D_LOG_DEBUG;
			else
				return bad("--log-level", optarg, "error, warn, info or debug");
			break;
		case O_HELP:
		case 'h':
			usage(stdout, cfg.db, cfg.socket);
			return 0;
		default:
			usage(stderr, cfg.db, cfg.socket);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "k3cached: unexpected argument \"%s\"\n", argv[optind]);
		usage(stderr, cfg.db, cfg.socket);
		return 2;
	}
	/* Keep freed payload memory in the heap: the VM hands pages back to the
	 * host, and faulting 600 MiB in again for the next publish is slow. */
	mallopt(M_MMAP_MAX, 0);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
	return k3d_server_run(&cfg);
}
