/* ctl: the pieces of k3cachectl shared between its command files. */
#ifndef K3_CTL_H
#define K3_CTL_H

#include <stddef.h>
#include <stdint.h>

/* Exit codes (contract: DESIGN.md "Programs"). */
enum ctl_exit {
	CTL_EXIT_OK = 0,
	CTL_EXIT_ERROR = 1,    /* an error answer, or an invalid input */
	CTL_EXIT_USAGE = 2,    /* bad command line */
	CTL_EXIT_NODAEMON = 3, /* the daemon cannot be reached */
	CTL_EXIT_NOTFOUND = 4, /* the key is not found */
};

struct ctl_globals {
	const char *socket;
	const char *db;
	int json;
};

/* A file mapped read-only (or an empty buffer for an empty file). */
struct ctl_file {
	const unsigned char *data;
	size_t size;
	void *map;
};

int ctl_file_open(const char *path, struct ctl_file *f, char *err, size_t errsz);
void ctl_file_close(struct ctl_file *f);

/* Parses "1,2,3" into a malloc'd array. Returns 0, or -1 with a message. */
int ctl_parse_tokens(const char *list, uint32_t **out, uint32_t *n, char *err, size_t errsz);

/* Parses a whole decimal u32. Returns 0 or -1. */
int ctl_parse_u32(const char *s, uint32_t *out);

/* Offline commands (need no daemon). argv[0] is the command word. */
int ctl_cmd_blob(const struct ctl_globals *g, int argc, char **argv);
int ctl_cmd_model(const struct ctl_globals *g, int argc, char **argv);
int ctl_cmd_key(const struct ctl_globals *g, int argc, char **argv);

#endif
