/* k3cachectl: the operator's command-line tool. main() parses the global
 * options and hands the command to its entry (cmd.h); the usage text is
 * generated from the command table. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cmd.h"

static void usage(FILE *out)
{
	fputs("usage: k3cachectl [--socket PATH | --db DIR] [--json] COMMAND [ARGS]\n\n", out);
	ctl_cmd_print_list(out);
	fputs("\n"
	      "Global options (before COMMAND):\n"
	      "  --socket PATH  unix:PATH, tcp:HOST:PORT or a path (default $K3CACHE_SOCKET,\n"
	      "                 else the daemon's default socket)\n"
	      "  --db DIR       read a store directly, read-only (after a crash, say)\n"
	      "  --json         print one JSON document\n"
	      "  --version      print k3cachectl's version\n"
	      "  --help         this text; COMMAND --help for a command's usage and help\n"
	      "KEY is a unique hex prefix of at least 8 digits.\n"
	      "\n"
	      "Exit: 0 ok, 1 error answer or invalid input, 2 usage, 3 daemon unreachable\n"
	      "or the connection lost with no answer, 4 key not found.\n",
	      out);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	        {"socket", required_argument, NULL, 's'}, {"db", required_argument, NULL, 'd'},
	        {"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
	        {"version", no_argument, NULL, 'V'},      {NULL, 0, NULL, 0}};
	struct ctl_globals g = {.socket = getenv("K3CACHE_SOCKET")};
	int c;
	/* "+": stop at the first non-option, which is the command */
	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			g.socket = optarg;
			break;
		case 'd':
			g.db = optarg;
			break;
		case 'j':
			g.json = 1;
			break;
		case 'h':
			usage(stdout);
			return CTL_EXIT_OK;
		case 'V':
			puts("k3cachectl " K3_VERSION);
			return CTL_EXIT_OK;
		default: /* getopt said which */
			fputs("k3cachectl: run 'k3cachectl --help' for the options and commands\n",
			      stderr);
			return CTL_EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return CTL_EXIT_USAGE;
	}
	int rc = ctl_cmd_dispatch(&g, argc - optind, argv + optind);
	if (rc < 0) {
		char like[32];
		const char *guess = ctl_cmd_suggest(argv[optind], like, sizeof(like));
		fprintf(stderr, "k3cachectl: unknown command \"%s\"", argv[optind]);
		if (guess)
			fprintf(stderr, " (did you mean \"%s\"?)", guess);
		fputs("; run 'k3cachectl --help' for the commands\n", stderr);
		rc = CTL_EXIT_USAGE;
	}
	return rc;
}
