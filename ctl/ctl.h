/* ctl: the pieces of k3cachectl its command files share: exit codes, the
 * global options, the two backends (a daemon, or a store opened read-only
 * with --db), the store's model specs, and formatting. The commands
 * themselves are entries of one table (cmd.h). */
#ifndef K3_CTL_H
#define K3_CTL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
/* A file read whole into memory (not mapped: see ctl_file_open). */
struct ctl_file {
	const unsigned char *data;
	size_t size;
	void *buf; /* freed by ctl_file_close */
};

int ctl_file_open(const char *path, struct ctl_file *f, char *err, size_t errsz);
void ctl_file_close(struct ctl_file *f);

/* Parses "1,2,3" into a malloc'd array. Returns 0, or -1 with a message. */
int ctl_parse_tokens(const char *list, uint32_t **out, uint32_t *n, char *err, size_t errsz);

/* Parses a whole decimal u32: digits only, no sign or space. Returns 0 or -1. */
int ctl_parse_u32(const char *s, uint32_t *out);

/* ---- talking to a daemon, or to a store directly (--db) ---- */

#include "frame.h"

struct k3cache;
struct store;

struct ctl_backend {
	struct k3cache *conn; /* daemon mode */
	struct store *store;  /* --db mode: opened read-only */
	const char *where;    /* the socket or the directory, for messages */
};

/* The exit code for a failed library call: 3 when the daemon could not be
 * reached or the connection to it broke (no answer: INTERNAL), else 1 (an
 * error answer, even one the library then closed the connection after). */
struct k3cache_error;
int ctl_exit_of(const struct k3cache_error *err);

/* Opens the backend named by the globals. Returns 0, or an exit code after
 * printing why (3 when the daemon cannot be reached). */
int ctl_backend_open(const struct ctl_globals *g, struct ctl_backend *b, const char *cmd);
void ctl_backend_close(struct ctl_backend *b);

/* Runs one request (without payload). On success *resp holds the answer
 * (which may carry an error code) and 0 is returned; otherwise an exit code
 * after printing why. Free the answer with ctl_response_free(). In --db mode
 * only the read-only ops are available (`cmd` names the command in errors). */
int ctl_call(struct ctl_backend *b, frame_request *req, frame_response **resp, const char *cmd);
void ctl_response_free(struct ctl_backend *b, frame_response *resp);

/* ctl_call() of a request whose error answer ends the command: that answer
 * is printed (ctl_answer_error), freed, and its exit code returned. On 0,
 * *resp holds an OK answer. */
int ctl_call_ok(struct ctl_backend *b, frame_request *req, frame_response **resp, const char *cmd);

/* Prints an error answer ("k3cachectl CMD: CODE: message") and returns the
 * exit code for it (4 for NOT_FOUND, 1 otherwise). */
int ctl_answer_error(const frame_response *resp, const char *cmd);

/* Resolves a hex key prefix (at least 8 digits) to a key. Returns 0 or an
 * exit code after printing why (2 too short, 4 no such key, 1 ambiguous). */
int ctl_resolve_key(struct ctl_backend *b, const char *hex, uint8_t key[32], const char *cmd);

/* One entry with its tokens and layers (Inspect). Returns 0 with *resp (an
 * answer with exactly one entry; free with ctl_response_free), or an exit
 * code after printing why. */
int ctl_inspect_entry(struct ctl_backend *b, const uint8_t key[32], frame_response **resp,
                      const char *cmd);

/* The layers of an entry: its blobs fetched whole (restore), for inspect and
 * export; with `progress`, a progress line on stderr ("CMD KEY: reading",
 * progress.h) while they arrive. Returns 0 or an exit code. *bufs[i] are
 * malloc'd; free with ctl_layers_free(). */
struct ctl_layers {
	uint32_t n;
	unsigned char **data;
	uint64_t *size;
	uint64_t *xxh3;
	uint32_t prefix_len;
	uint8_t model[32];
};
int ctl_fetch_layers(struct ctl_backend *b, const uint8_t key[32], struct ctl_layers *out,
                     int progress, const char *cmd);
void ctl_layers_free(struct ctl_layers *l);

/* ---- the store's model specs (models.c) ---- */

/* Every stored model spec (a ListModels answer). Returns 0 with *resp (free
 * with ctl_response_free), or an exit code after printing why. */
int ctl_fetch_models(struct ctl_backend *b, frame_response **resp, const char *cmd);

struct k3cache_model;
/* The stored model spec with this fingerprint in *spec (caller frees), NULL
 * when none is stored: 0; or an exit code after printing why the specs
 * could not be read (3 for a daemon lost), *spec NULL. */
int ctl_model_spec(struct ctl_backend *b, const uint8_t fp[32], struct k3cache_model **spec,
                   const char *cmd);

/* The fingerprints a --model argument names: a 64-hex fingerprint as it is,
 * or those of every stored spec with that name (none, one, or several).
 * *unlisted (when not NULL) says a fingerprint given is no listed spec's: a
 * typo, or a spec damaged on disk whose entries are still there, so the
 * caller says "not found" only when nothing was found under it either.
 * Returns 0 with *fps (malloc'd, caller frees) and *n, or an exit code
 * after printing why. */
int ctl_models_named(struct ctl_backend *b, const char *arg, int *unlisted, uint8_t (**fps)[32],
                     size_t *n, const char *cmd);

/* ---- formatting (util.c) ---- */

struct json_t;

/* Prints a JSON document (indented, in insertion order) and a newline to
 * out, then frees it. */
void ctl_print_json(FILE *out, struct json_t *doc);
/* The value of a Stat answer's counter; 0 when it has none by that name. */
uint64_t ctl_counter(const frame_response *r, const char *name);

/* The hex of up to 64 bytes as a JSON string. */
struct json_t *ctl_hex_json(const uint8_t *bytes, size_t len);

void ctl_size(uint64_t bytes, char *out, size_t outsz);
void ctl_ago(uint64_t when, char *out, size_t outsz);

#endif
