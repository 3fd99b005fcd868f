/* cmd: k3cachectl's commands as one table of entries, the way tmux builds
 * its commands (cmd-*.c, struct cmd_entry). Each command is one file,
 * cmd_NAME.c, exporting one entry: its name, its usage, its help, its flags
 * and the function that runs it; cmd.c holds the table. Everything else
 * about a command is derived from its entry:
 *  - dispatch, by its one word ("ls") or two ("model add": a word shared by
 *    several entries is a group of subcommands);
 *  - the usage line of a usage error and of `COMMAND --help`, and the list
 *    `k3cachectl --help` prints, grouped by flags;
 *  - what the global options allow: a command without CTL_CMD_DB is
 *    refused under --db, one with only CTL_CMD_DB needs --db, one with no
 *    flag runs on files and arguments alone.
 * Adding a command is adding its file and a line of the table. */
#ifndef K3_CTL_CMD_H
#define K3_CTL_CMD_H

#include <getopt.h>
#include <stdio.h>

#include "ctl.h"

enum ctl_cmd_flag {
	/* talks to the daemon (--socket). Without CTL_CMD_DB it changes the
	 * store, which --db opens read-only: --db refuses it. */
	CTL_CMD_DAEMON = 1u << 0,
	/* works on a store opened read-only with --db DIR, no daemon needed.
	 * Without CTL_CMD_DAEMON it needs --db. */
	CTL_CMD_DB = 1u << 1,
};

struct ctl_cmd_entry {
	const char *name;  /* "ls", or two words for a subcommand: "model add" */
	const char *usage; /* its arguments, after the name ("" for none) */
	/* the first line: the summary `k3cachectl --help` lists; all of it:
	 * what `COMMAND --help` prints under the usage line */
	const char *help;
	unsigned flags; /* enum ctl_cmd_flag */
	/* argv[0] is the command's last word; optind = 0 starts getopt afresh */
	int (*exec)(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
	            char **argv);
};

/* Runs the command argv names (argv[0] its first word): `--help` anywhere
 * among its arguments prints its usage and help; then the flags' checks;
 * then its exec. Returns the exit code, or -1 when argv[0] names no command
 * (nothing printed). */
int ctl_cmd_dispatch(const struct ctl_globals *g, int argc, char **argv);

/* A command's first word like `word` (one a prefix of the other, at least
 * two letters: "stats" for "stat"), for "did you mean"; NULL when none. */
const char *ctl_cmd_suggest(const char *word, char *buf, size_t bufsz);

/* The command list of `k3cachectl --help`: a line (or two) per command, in
 * groups by flags. */
void ctl_cmd_print_list(FILE *out);

/* "k3cachectl NAME: MESSAGE" and the command's usage line on stderr.
 * Returns CTL_EXIT_USAGE. */
__attribute__((format(printf, 2, 3))) int ctl_cmd_usage_error(const struct ctl_cmd_entry *self,
                                                              const char *fmt, ...);

/* After the command's getopt_long (opterr is 0 under ctl_cmd_dispatch)
 * returned '?': says which argument and why, in k3cachectl's words, with the
 * usage line: an option of the command without its value ("--idle needs a
 * value"), one given a value it takes none of, an unknown option, or a global
 * option, which goes before the command ("--socket is a global option: it
 * goes before the command: k3cachectl --socket PATH stat"). opts and
 * shortopts are what getopt_long was given. Returns CTL_EXIT_USAGE. */
int ctl_cmd_option_error(const struct ctl_cmd_entry *self, char **argv, const struct option *opts,
                         const char *shortopts);

/* The start of a command that takes operands only (FILE): refuses any
 * option as ctl_cmd_option_error says (the operands may come in any order
 * around "--"). Returns 0 with *first the index of the first operand in
 * argv, or the exit code. */
int ctl_cmd_operands(const struct ctl_cmd_entry *self, int argc, char **argv, int *first);

/* The start of a command that takes no arguments but --json: parses them
 * (*json starts as the global --json) and opens the backend the global
 * options name. Returns 0, or the exit code after saying why. */
int ctl_cmd_open(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                 char **argv, int *json, struct ctl_backend *b);

#endif
