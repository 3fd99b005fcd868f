/* Seeds for fuzz_cluster: the CLUSTER SLOTS, MOVED and ASK replies recorded
 * from a real cluster (tests/unit/cluster_replies.h) and a few seed lists.
 * usage: fuzz_cluster_seeds DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_replies.h"

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	const char *seeds[] = {
	        slots_3masters,
	        slots_replicas,
	        slots_nil_hosts,
	        slots_unknown_hosts,
	        moved_reply,
	        ask_reply,
	        moved_empty_host,
	        moved_unknown_host,
	        "MOVED 3999 ::1:7000",
	        "ASK 16383 [::1]:7000",
	        "redis://127.0.0.1:7000,[::1]:7001,redis-a.example:7002",
	};
	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/cluster-%zu", argv[1], i);
		FILE *f = fopen(path, "wb");
		size_t n = strlen(seeds[i]);
		if (!f || fwrite(seeds[i], 1, n, f) != n)
			return 1;
		fclose(f);
	}
	return 0;
}
