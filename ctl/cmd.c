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

int ctl_cmd_open(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                 char **argv, int *json, struct ctl_backend *b)
{
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'}, {NULL, 0, NULL, 0}};
	int c;
	*json = g->json;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c != 'j')
			return ctl_cmd_usage_error(self, "unknown option");
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
	return e->exec(e, g, argc, argv);
}
