/* tier2: status names and the pieces tier2's put, lookup and get share
 * (tier2_io.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier2/tier2_io.h"

const char *tier2_status_name(enum tier2_status st)
{
	switch (st) {
	case TIER2_OK:
		return "ok";
	case TIER2_MISSING:
		return "missing";
	case TIER2_DAMAGED:
		return "damaged";
	case TIER2_TIMEOUT:
		return "timeout";
	case TIER2_NODE_ERROR:
		return "node-error";
	case TIER2_INVALID:
		return "invalid";
	case TIER2_NOMEM:
		return "nomem";
	case TIER2_TOO_LARGE:
		return "too-large";
	case TIER2_PARTIAL:
		return "partial";
	}
	return "unknown";
}

void tier2_io_err(char *err, size_t errsz, const char *fmt, ...)
{
	if (!err || !errsz)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errsz, fmt, ap);
	va_end(ap);
}

enum tier2_status tier2_io_pipeline(struct cluster_router *r, struct cluster_cmd *cmds, size_t n,
                                    const char *what, char *err, size_t errsz)
{
	if (n == 0)
		return TIER2_OK;
	struct cluster_stats before = cluster_stats(r);
	size_t failed = cluster_pipeline(r, cmds, n);
	if (failed == 0)
		return TIER2_OK;
	struct cluster_stats after = cluster_stats(r);
	tier2_io_err(err, errsz, "tier2: %s: %zu of %zu commands got no reply: %s", what, failed, n,
	             cluster_error(r));
	return after.nomem != before.nomem         ? TIER2_NOMEM
	       : after.timeouts != before.timeouts ? TIER2_TIMEOUT
	                                           : TIER2_NODE_ERROR;
}

enum tier2_status tier2_io_node(struct cluster_router *r, size_t master, int argc,
                                const char **argv, const size_t *argvlen, redisReply **reply,
                                const char *what, char *err, size_t errsz)
{
	struct cluster_stats before = cluster_stats(r);
	if (cluster_command_node(r, master, argc, argv, argvlen, reply) == 0)
		return TIER2_OK;
	struct cluster_stats after = cluster_stats(r);
	tier2_io_err(err, errsz, "tier2: %s: master %zu: %s", what, master, cluster_error(r));
	return after.nomem != before.nomem         ? TIER2_NOMEM
	       : after.timeouts != before.timeouts ? TIER2_TIMEOUT
	                                           : TIER2_NODE_ERROR;
}

void tier2_io_cmd2(struct cluster_cmd *cmd, struct tier2_cmd2 *c, const char *verb, size_t name_len)
{
	c->argv[0] = verb;
	c->len[0] = strlen(verb);
	c->argv[1] = c->name;
	c->len[1] = name_len;
	*cmd = (struct cluster_cmd){c->name, name_len, 2, c->argv, c->len, NULL, 0};
}

void tier2_io_free_replies(struct cluster_cmd *cmds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (cmds[i].reply)
			freeReplyObject(cmds[i].reply);
		cmds[i].reply = NULL;
	}
}

static enum tier2_status unexpected(const redisReply *rep, const char *cmd, const char *key,
                                    const char *want, char *err, size_t errsz)
{
	if (rep->type == REDIS_REPLY_ERROR || rep->type == REDIS_REPLY_STATUS)
		tier2_io_err(err, errsz, "tier2: %s %s: %.*s", cmd, key,
		             (int)(rep->len > 200 ? 200 : rep->len), rep->str ? rep->str : "");
	else
		tier2_io_err(err, errsz, "tier2: %s %s: a reply of type %d, not %s", cmd, key,
		             rep->type, want);
	return TIER2_NODE_ERROR;
}

enum tier2_status tier2_io_want_ok(const redisReply *rep, const char *cmd, const char *key,
                                   char *err, size_t errsz)
{
	if (rep->type == REDIS_REPLY_STATUS && rep->len == 2 && rep->str[0] == 'O' &&
	    rep->str[1] == 'K')
		return TIER2_OK;
	return unexpected(rep, cmd, key, "OK", err, errsz);
}

enum tier2_status tier2_io_want_int(const redisReply *rep, const char *cmd, const char *key,
                                    char *err, size_t errsz)
{
	if (rep->type == REDIS_REPLY_INTEGER)
		return TIER2_OK;
	return unexpected(rep, cmd, key, "an integer", err, errsz);
}
