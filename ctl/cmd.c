#include "cmd.h"

#include <getopt.h>
#include <stdarg.h>
#include <string.h>

extern const struct ctl_cmd_entry ctl_cmd_ping_entry, ctl_cmd_stat_entry, ctl_cmd_ls_entry,
        ctl_cmd_inspect_entry, ctl_cmd_evict_entry, ctl_cmd_verify_entry, ctl_cmd_models_entry,
        ctl_cmd_export_entry, ctl_cmd_model_add_entry, ctl_cmd_import_entry, ctl_cmd_blob_entry,
        ctl_cmd_model_fingerprint_entry, ctl_cmd_key_entry, ctl_cmd_salvage_entry;

/* Every command, in the order `k3cachectl --help` lists them (by group). */
static const struct ctl_cmd_entry *const table[] = {
        &ctl_cmd_ping_entry,    &ctl_cmd_stat_entry,    &ctl_cmd_ls_entry,
        &ctl_cmd_inspect_entry, &ctl_cmd_evict_entry,   &ctl_cmd_verify_entry,
        &ctl_cmd_models_entry,  &ctl_cmd_export_entry,  &ctl_cmd_model_add_entry,
        &ctl_cmd_import_entry,  &ctl_cmd_blob_entry,    &ctl_cmd_model_fingerprint_entry,
        &ctl_cmd_key_entry,     &ctl_cmd_salvage_entry,
};
enum { N_CMDS = sizeof(table) / sizeof(table[0]) };

/* ---- what the flags mean for the global options ------------------------- */

static int changes_store(const struct ctl_cmd_entry *e)
{
	return (e->flags & CTL_CMD_DAEMON) && !(e->flags & CTL_CMD_DB);
}

static int needs_db(const struct ctl_cmd_entry *e)
{
	return (e->flags & CTL_CMD_DB) && !(e->flags & CTL_CMD_DAEMON);
}

/* The global options a command takes, as its usage line shows them. */
static const char *globals_of(const struct ctl_cmd_entry *e)
{
	if (e->flags & CTL_CMD_DAEMON)
		return e->flags & CTL_CMD_DB ? "[--socket PATH | --db DIR] [--json] "
		                             : "[--socket PATH] [--json] ";
	return e->flags & CTL_CMD_DB ? "--db DIR [--json] " : "[--json] ";
}

#define WRAP_COLUMN    80
#define SUMMARY_COLUMN 42

/* The length of the word at p: up to a space outside brackets. */
static size_t word_len(const char *p)
{
	int depth = 0;
	size_t n = 0;
	for (; p[n] && (p[n] != ' ' || depth > 0); n++)
		depth += (p[n] == '[') - (p[n] == ']');
	return n;
}

/* The length of the piece of a usage text at p that a line break must not
 * split: a word, an option with its argument ("--model NAME|FP"), and a
 * "|" that follows either. */
static size_t piece_len(const char *p)
{
	size_t n = word_len(p);
	for (;;) {
		const char *next = p + n + (p[n] == ' ');
		if (!p[n] || !*next)
			return n;
		int arg = p[0] == '-' && !strchr("-[|", next[0]) && n == word_len(p);
		if (!arg && strcmp(next, "|") != 0 && strncmp(next, "| ", 2) != 0)
			return n;
		n = (size_t)(next - p) + word_len(next);
	}
}

/* Writes text on a line where `col` columns are taken, breaking it between
 * pieces (piece_len) so that no line runs past WRAP_COLUMN unless a piece
 * does; a new line starts with `indent` spaces. Returns the column it ends
 * at. */
static int put_wrapped(FILE *out, int col, const char *text, int indent)
{
	for (const char *p = text; *p;) {
		size_t n = piece_len(p);
		if (p != text && col + 1 + (int)n > WRAP_COLUMN) {
			fprintf(out, "\n%*s", indent, "");
			col = indent;
		} else if (p != text) {
			fputc(' ', out);
			col++;
		}
		fwrite(p, 1, n, out);
		col += (int)n;
		for (p += n; *p == ' '; p++) {
		}
	}
	return col;
}

/* "k3cachectl GLOBALS NAME USAGE" for a usage line, or "NAME USAGE" (with
 * "--db DIR" first when it needs one) for the list. */
static void command_line(const struct ctl_cmd_entry *e, int full, char *out, size_t outsz)
{
	snprintf(out, outsz, "%s%s%s%s%s", full ? "k3cachectl " : "",
	         full          ? globals_of(e)
	         : needs_db(e) ? "--db DIR "
	                       : "",
	         e->name, *e->usage ? " " : "", e->usage);
}

static void print_usage_line(const struct ctl_cmd_entry *e, FILE *out)
{
	char line[512];
	command_line(e, 1, line, sizeof(line));
	fputs("usage: ", out);
	put_wrapped(out, 7, line, 8);
	fputc('\n', out);
}

static void print_help(const struct ctl_cmd_entry *e, FILE *out)
{
	print_usage_line(e, out);
	fprintf(out, "\n%s", e->help);
}

/* ---- the list of k3cachectl --help ------------------------------------- */

static void print_entry_line(const struct ctl_cmd_entry *e, FILE *out)
{
	char line[512];
	command_line(e, 0, line, sizeof(line));
	fputs("  ", out);
	int col = put_wrapped(out, 2, line, 8);
	if (col >= SUMMARY_COLUMN) {
		fputc('\n', out);
		col = 0;
	}
	fprintf(out, "%*s%.*s\n", SUMMARY_COLUMN - col, "", (int)strcspn(e->help, "\n"), e->help);
}

const char *ctl_cmd_suggest(const char *word, char *buf, size_t bufsz)
{
	size_t wl = strlen(word);
	for (size_t i = 0; i < N_CMDS; i++) {
		const char *name = table[i]->name;
		size_t nl = strcspn(name, " "); /* its first word */
		size_t common = wl < nl ? wl : nl;
		if (common >= 2 && wl != nl && !strncmp(word, name, common)) {
			snprintf(buf, bufsz, "%.*s", (int)nl, name);
			return buf;
		}
	}
	return NULL;
}

void ctl_cmd_print_list(FILE *out)
{
	static const struct {
		const char *title;
		int (*member)(const struct ctl_cmd_entry *);
	} groups[] = {
	        {"Commands (through the daemon; with --db DIR on a store, read-only, no daemon):",
	         NULL},
	        {"Commands that change the store (through the daemon only):", changes_store},
	        {"Commands that need no daemon:", NULL},
	};
	for (size_t gi = 0; gi < sizeof(groups) / sizeof(groups[0]); gi++) {
		fprintf(out, "%s%s\n", gi ? "\n" : "", groups[gi].title);
		for (size_t i = 0; i < N_CMDS; i++) {
			const struct ctl_cmd_entry *e = table[i];
			int daemon = (e->flags & CTL_CMD_DAEMON) != 0;
			int in = gi == 0   ? daemon && !changes_store(e)
			         : gi == 1 ? changes_store(e)
			                   : !daemon;
			if (in)
				print_entry_line(e, out);
		}
	}
}

/* ---- errors and options shared by the commands -------------------------- */

int ctl_cmd_usage_error(const struct ctl_cmd_entry *self, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "k3cachectl %s: ", self->name);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	print_usage_line(self, stderr);
	return CTL_EXIT_USAGE;
}

/* The global options (k3cachectl.c parses them, before the command), with
 * their argument; a command that takes one of them too (--json) never gets
 * here for it. */
static const struct {
	const char *name, *arg;
	int alone; /* the program's whole work: no command goes with it */
} global_opts[] = {
        {"socket", "PATH", 0},
        {"db", "DIR", 0},
        {"json", NULL, 0},
        {"version", NULL, 1},
};

/* The option of opts that --NAME (len bytes) names: its exact name, else the
 * one it is a prefix of; NULL when none or several (*several set). */
static const struct option *long_match(const struct option *opts, const char *name, size_t len,
                                       int *several)
{
	const struct option *found = NULL;
	*several = 0;
	for (const struct option *o = opts; o && o->name; o++) {
		if (strncmp(o->name, name, len) != 0)
			continue;
		if (strlen(o->name) == len)
			return o;
		*several |= found != NULL;
		found = o;
	}
	return *several ? NULL : found;
}

/* When --NAME (len bytes, a prefix of the option's name) is a global
 * option: says that it goes before the command, and how, with val (the
 * user's, or NULL) as its value. Returns CTL_EXIT_USAGE, or 0 when NAME is
 * no global option. */
static int global_option_error(const struct ctl_cmd_entry *self, const char *name, size_t len,
                               const char *val)
{
	for (size_t i = 0; i < sizeof(global_opts) / sizeof(global_opts[0]); i++) {
		const char *g = global_opts[i].name, *arg = global_opts[i].arg;
		if (len == 0 || strncmp(g, name, len) != 0)
			continue;
		if (global_opts[i].alone)
			return ctl_cmd_usage_error(self, "--%s is a global option: k3cachectl --%s",
			                           g, g);
		if (arg && val)
			arg = val;
		return ctl_cmd_usage_error(self,
		                           "--%s is a global option: it goes before the command: "
		                           "k3cachectl --%s%s%s %s",
		                           g, g, arg ? " " : "", arg ? arg : "", self->name);
	}
	return 0;
}

/* A global option that no command takes (--socket, --db, --version) among
 * the command's arguments, before any "--": refused as global_option_error
 * says (before the checks of --db, which it would confuse). Returns 0 when
 * there is none. */
static int misplaced_global(const struct ctl_cmd_entry *self, int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (strncmp(argv[i], "--", 2) != 0)
			continue;
		const char *name = argv[i] + 2, *eq = strchr(name, '=');
		size_t len = eq ? (size_t)(eq - name) : strlen(name);
		if (len == 4 && !strncmp(name, "json", 4))
			continue; /* most commands take it: their getopt decides */
		/* its value: after '=', else the next argument unless an option */
		const char *val = eq ? eq + 1 : argv[i + 1];
		if (val && !eq && val[0] == '-')
			val = NULL;
		for (size_t k = 0; k < sizeof(global_opts) / sizeof(global_opts[0]); k++)
			if (strlen(global_opts[k].name) == len &&
			    !strncmp(global_opts[k].name, name, len))
				return global_option_error(self, name, len, val);
	}
	return 0;
}

int ctl_cmd_option_error(const struct ctl_cmd_entry *self, char **argv, const struct option *opts,
                         const char *shortopts)
{
	/* getopt_long has moved optind past the argument it refused, unless
	 * that was a short option inside a bundle (-xy), which it is still on */
	const char *arg = optind > 0 ? argv[optind - 1] : "";
	const char *here = argv[optind];
	if (optopt && here && here[0] == '-' && here[1] && here[1] != '-' &&
	    strchr(here + 1, optopt))
		arg = here;
	if (strncmp(arg, "--", 2) != 0 || !arg[2]) {
		const char *at = optopt ? strchr(shortopts, optopt) : NULL;
		if (at && at[1] == ':')
			return ctl_cmd_usage_error(self, "-%c needs a value", optopt);
		return ctl_cmd_usage_error(self, "unknown option -%c", optopt ? optopt : '?');
	}
	const char *name = arg + 2, *eq = strchr(name, '=');
	size_t len = eq ? (size_t)(eq - name) : strlen(name);
	int several = 0;
	const struct option *o = long_match(opts, name, len, &several);
	if (o && o->has_arg == required_argument && !eq)
		return ctl_cmd_usage_error(self, "--%s needs a value", o->name);
	if (o && o->has_arg == no_argument && eq)
		return ctl_cmd_usage_error(self, "--%s takes no value", o->name);
	if (several)
		return ctl_cmd_usage_error(
		        self, "--%.*s is ambiguous: give the option's whole name", (int)len, name);
	/* the value the user gave, if any, else the argument's name */
	const char *val = eq                                       ? eq + 1
	                  : argv[optind] && argv[optind][0] != '-' ? argv[optind]
	                                                           : NULL;
	int rc = global_option_error(self, name, len, val);
	if (rc)
		return rc;
	return ctl_cmd_usage_error(self, "unknown option --%.*s", (int)len, name);
}

int ctl_cmd_operands(const struct ctl_cmd_entry *self, int argc, char **argv, int *first)
{
	static const struct option none[] = {{NULL, 0, NULL, 0}};
	optind = 0;
	if (getopt_long(argc, argv, "", none, NULL) != -1)
		return ctl_cmd_option_error(self, argv, none, "");
	*first = optind;
	return 0;
}

int ctl_cmd_open(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                 char **argv, int *json, struct ctl_backend *b)
{
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'}, {NULL, 0, NULL, 0}};
	int c;
	*json = g->json;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c != 'j')
			return ctl_cmd_option_error(self, argv, opts, "");
		*json = 1;
	}
	if (optind != argc)
		return ctl_cmd_usage_error(self, "unexpected argument");
	return ctl_backend_open(g, b, self->name);
}

/* ---- dispatch -------------------------------------------------------- */

/* Whether e is a subcommand of word ("model add" of "model"). */
static int in_group(const struct ctl_cmd_entry *e, const char *word)
{
	size_t n = strlen(word);
	return !strncmp(e->name, word, n) && e->name[n] == ' ';
}

/* How many words of argv the entry's name is (1 or 2), or 0 when its name
 * is not argv's first words. */
static int match(const struct ctl_cmd_entry *e, int argc, char **argv)
{
	if (!strcmp(e->name, argv[0]))
		return 1;
	return argc >= 2 && in_group(e, argv[0]) && !strcmp(e->name + strlen(argv[0]) + 1, argv[1])
	               ? 2
	               : 0;
}

static int is_help(const char *arg)
{
	return !strcmp(arg, "--help") || !strcmp(arg, "-h");
}

/* argv[0] is a word several entries share ("model"), but argv[1] is none of
 * their subcommands: the group's help, or a usage error naming them. -1
 * when argv[0] is no group either. */
static int group(int argc, char **argv)
{
	char names[256] = "";
	size_t n = 0;
	int help = argc >= 2 && is_help(argv[1]);
	for (size_t i = 0; i < N_CMDS; i++) {
		const struct ctl_cmd_entry *e = table[i];
		if (!in_group(e, argv[0]))
			continue;
		if (help && n)
			fputc('\n', stdout);
		if (help)
			print_help(e, stdout);
		else
			snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
			         n ? ", " : "", e->name + strlen(argv[0]) + 1);
		n++;
	}
	if (!n)
		return -1;
	if (help)
		return CTL_EXIT_OK;
	if (argc < 2)
		fprintf(stderr, "k3cachectl %s: expects a subcommand: %s\n", argv[0], names);
	else
		fprintf(stderr, "k3cachectl %s: unknown subcommand \"%s\" (%s has: %s)\n", argv[0],
		        argv[1], argv[0], names);
	for (size_t i = 0; i < N_CMDS; i++)
		if (in_group(table[i], argv[0]))
			print_usage_line(table[i], stderr);
	return CTL_EXIT_USAGE;
}

int ctl_cmd_dispatch(const struct ctl_globals *g, int argc, char **argv)
{
	const struct ctl_cmd_entry *e = NULL;
	int words = 0;
	for (size_t i = 0; i < N_CMDS && !e; i++)
		if ((words = match(table[i], argc, argv)) != 0)
			e = table[i];
	if (!e)
		return group(argc, argv);
	argc -= words - 1;
	argv += words - 1;
	for (int i = 1; i < argc; i++) {
		if (is_help(argv[i])) {
			print_help(e, stdout);
			return CTL_EXIT_OK;
		}
	}
	int rc = misplaced_global(e, argc, argv);
	if (rc)
		return rc;
	if (g->db && changes_store(e)) {
		fprintf(stderr,
		        "k3cachectl %s: changes the store: it needs the daemon (--db opens the "
		        "store "
		        "read-only)\n",
		        e->name);
		return CTL_EXIT_ERROR;
	}
	if (!g->db && needs_db(e))
		return ctl_cmd_usage_error(e, "works on a store directory: name it with --db DIR");
	opterr = 0; /* a command's refused option: ctl_cmd_option_error says why */
	return e->exec(e, g, argc, argv);
}
