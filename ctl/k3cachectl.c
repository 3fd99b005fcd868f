/* k3cachectl: the operator's command-line tool. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

static const char usage[] =
        "usage: k3cachectl [--socket PATH | --db DIR] [--json] COMMAND [ARGS]\n"
        "\n"
        "Commands (with --db DIR the read-only ones work on a store, no daemon needed):\n"
        "  ping                                   is the daemon there?\n"
        "  stat                                   everything the daemon counts\n"
        "  ls [--model M] [--sort used|size|len|created|hits] [--limit N]\n"
        "  inspect KEY [--layer I] [--values]     one entry, layer by layer\n"
        "  evict KEY... | --model M | --idle DUR | --to-size SIZE | --all\n"
        "        [--dry-run] [--yes]\n"
        "  verify                                 re-check every entry\n"
        "  models                                 the model specs stored\n"
        "  model add FILE.json                    store a model spec\n"
        "  export KEY -o FILE|-                   an entry to a snapshot file (-: stdout)\n"
        "  import FILE                            a snapshot file, validated like a publish\n"
        "\n"
        "Commands that need no daemon:\n"
        "  blob FILE [--model SPEC --layer I [--prefix-len P]]  parse and validate a blob\n"
        "  model fingerprint SPEC.json            print a model's fingerprint\n"
        "  key --model SPEC [--salt S] --tokens 1,2,3  print an entry key\n"
        "  --db DIR salvage --to NEWDIR           copy what verifies of a damaged store\n"
        "                                         into a new one (DIR is not written)\n"
        "\n"
        "Global options:\n"
        "  --socket PATH  unix:PATH, tcp:HOST:PORT or a path (default $K3CACHE_SOCKET,\n"
        "                 else the daemon's default socket)\n"
        "  --db DIR       read a store directly, read-only (after a crash, say)\n"
        "  --json         print one JSON document\n"
        "  --version      print k3cachectl's version\n"
        "  --help         this text; COMMAND --help for a command's\n"
        "KEY is a unique hex prefix of at least 8 digits.\n"
        "\n"
        "Exit: 0 ok, 1 error answer or invalid input, 2 usage, 3 daemon unreachable,\n"
        "4 key not found.\n";

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
			fputs(usage, stdout);
			return CTL_EXIT_OK;
		case 'V':
			puts("k3cachectl " K3_VERSION);
			return CTL_EXIT_OK;
		default:
			fputs(usage, stderr);
			return CTL_EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		fputs(usage, stderr);
		return CTL_EXIT_USAGE;
	}
	const char *cmd = argv[optind];
	int sub_argc = argc - optind;
	char **sub_argv = argv + optind;
	if (!strcmp(cmd, "blob"))
		return ctl_cmd_blob(&g, sub_argc, sub_argv);
	if (!strcmp(cmd, "model")) {
		if (sub_argc >= 2 && !strcmp(sub_argv[1], "add"))
			return ctl_cmd_model_add(&g, sub_argc - 1, sub_argv + 1);
		return ctl_cmd_model(&g, sub_argc, sub_argv);
	}
	static const struct {
		const char *name;
		int (*fn)(const struct ctl_globals *, int, char **);
	} cmds[] = {
	        {"ping", ctl_cmd_ping},     {"stat", ctl_cmd_stat},
	        {"ls", ctl_cmd_ls},         {"inspect", ctl_cmd_inspect},
	        {"evict", ctl_cmd_evict},   {"verify", ctl_cmd_verify},
	        {"models", ctl_cmd_models}, {"export", ctl_cmd_export},
	        {"import", ctl_cmd_import}, {"salvage", ctl_cmd_salvage},
	};
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(cmd, cmds[i].name))
			return cmds[i].fn(&g, sub_argc, sub_argv);
	if (!strcmp(cmd, "key"))
		return ctl_cmd_key(&g, sub_argc, sub_argv);
	fprintf(stderr, "k3cachectl: unknown command \"%s\"\n%s", cmd, usage);
	return CTL_EXIT_USAGE;
}
