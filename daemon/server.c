/* server: listeners, signals, the tick, and answering finished writer jobs. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/thread.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "paths.h"
#include "service.h"
#include "units.h"

static enum k3d_log log_level = K3D_LOG_INFO;

void k3d_set_log_level(enum k3d_log level)
{
	log_level = level;
}

/* Whether stderr is systemd's journal stream: $JOURNAL_STREAM names its
 * device and inode (systemd.exec(5)). Then each line starts with its
 * syslog priority, <3> to <7> (sd-daemon(3)), and journald stamps the time. */
static int to_journal(void)
{
	static int journal = -1;
	if (journal < 0) {
		const char *js = getenv("JOURNAL_STREAM");
		char *colon = NULL, *end = NULL;
		unsigned long long dev = js ? strtoull(js, &colon, 10) : 0;
		unsigned long long ino = colon && *colon == ':' ? strtoull(colon + 1, &end, 10) : 0;
		struct stat st;
		journal = end && end > colon + 1 && !*end && fstat(2, &st) == 0 &&
		          (unsigned long long)st.st_dev == dev &&
		          (unsigned long long)st.st_ino == ino;
	}
	return journal;
}

void k3d_log(enum k3d_log level, const char *fmt, ...)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};
	static const int priorities[] = {3, 4, 6, 7}; /* LOG_ERR, WARNING, INFO, DEBUG */
	if (level > log_level)
		return;
	va_list ap;
	va_start(ap, fmt);
	if (to_journal()) {
		fprintf(stderr, "<%d>%s: ", priorities[level], names[level]);
	} else {
		char when[32];
		time_t t = time(NULL);
		struct tm tm;
		gmtime_r(&t, &tm);
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
		fprintf(stderr, "%s k3cached %s: ", when, names[level]);
	}
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

double k3d_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- answering finished jobs --------------------------------------------------- */

static void answer_job(struct k3d_job *job)
{
	struct k3d_conn *c = job->conn;
	frame_response *r = &job->resp;
	r->id = job->req->id;
	if (job->req->op_case == K3CACHE__V1__REQUEST__OP_PUBLISH)
		k3d_publish_answer(job);
	k3d_conn_respond(c, r);
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct k3d_server *srv = arg;
	uint64_t n;
	if (fd >= 0 && read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		k3d_log(K3D_LOG_WARN, "done: read: %s", strerror(errno));
	struct k3d_job *job = k3d_writer_take_done(srv->writer);
	k3d_conn_windows_moved(srv);
	while (job) {
		struct k3d_job *next = job->next;
		struct k3d_conn *c = job->conn;
		if (job->chore == K3D_CHORE_VERIFY) {
			if (job->st.code == STATUS_CORRUPT)
				k3d_log(K3D_LOG_WARN, "restore: %s", job->st.message);
			k3d_stream_unref(job->stream);
			k3d_job_free(job);
			job = next;
			continue;
		}
		if (job->chore == K3D_CHORE_T2_STAGE) {
			if (srv->t2) /* else stopped: stored, with nobody to tell */
				k3d_t2_stored(srv, job);
			k3d_job_free(job);
			job = next;
			continue;
		}
		if (job->chore == K3D_CHORE_QUARANTINE || job->chore == K3D_CHORE_CHECK) {
			if (job->chore == K3D_CHORE_CHECK)
				k3d_report_checked(srv, job->key);
			k3d_job_free(job);
			job = next;
			continue;
		}
		if (job->chore) {
			srv->chore_pending = 0;
			k3d_job_free(job);
			job = next;
			continue;
		}
		if (job->orphaned) {                      /* its connection answered by itself */
			srv->inflight_bytes -= job->held; /* its window, freed here */
			k3d_job_free(job);
			k3d_conn_orphan_done(c);
			job = next;
			continue;
		}
		if (job->streamed && c->ingest == job) {
			/* a streamed publish the writer ended before its payload was
			 * whole (the daemon is stopping): there is nothing to answer */
			k3d_job_free(job);
			k3d_conn_ingest_ended(c);
			job = next;
			continue;
		}
		/* the connection's request is the job's: hand it back for metrics */
		c->req = job->req;
		if (c->state != K3D_DEAD)
			answer_job(job);
		c->req = NULL;
		/* the payload buffer goes back to the connection, then the pool (a
		 * streamed one is its window, closed with the job) */
		if (!job->streamed) {
			c->payload = job->payload;
			job->payload = NULL;
		}
		k3d_job_free(job);
		k3d_conn_request_done(c);
		job = next;
	}
}

/* ---- accepting ----------------------------------------------------------------- */

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *arg)
{
	(void)l;
	(void)socklen;
	struct k3d_server *srv = arg;
	char peer[64] = "unix";
	if (sa->sa_family == AF_INET || sa->sa_family == AF_INET6) {
		char host[48], port[8];
		if (getnameinfo(sa, (socklen_t)socklen, host, sizeof(host), port, sizeof(port),
		                NI_NUMERICHOST | NI_NUMERICSERV) == 0)
			snprintf(peer, sizeof(peer), "%s:%s", host, port);
	}
	if (srv->stopping) {
		srv->connections_refused++; /* accept_errors: refused while stopping */
		close(fd);
		return;
	}
	k3d_conn_accept(srv, fd, peer, sa->sa_family != AF_UNIX);
}

static void on_accept_error(struct evconnlistener *l, void *arg)
{
	struct k3d_server *srv = arg;
	int err = EVUTIL_SOCKET_ERROR();
	srv->connections_refused++;
	if (err == EMFILE || err == ENFILE) {
		/* out of descriptors: pause accepting; the tick resumes it */
		k3d_log(K3D_LOG_WARN, "accept: %s; pausing accepts for a second",
		        evutil_socket_error_to_string(err));
		evconnlistener_disable(l);
		return;
	}
	k3d_log(K3D_LOG_WARN, "accept: %s", evutil_socket_error_to_string(err));
}

static int listen_unix(struct k3d_server *srv, const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sun.sun_path)) {
		k3d_log(K3D_LOG_ERROR, "--socket %s: path too long", path);
		return -1;
	}
	memcpy(sun.sun_path, path, strlen(path) + 1);
	/* a live socket is refused; a stale one (nobody answers) is replaced */
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0 && connect(probe, (struct sockaddr *)&sun, sizeof(sun)) == 0) {
		close(probe);
		k3d_log(K3D_LOG_ERROR,
		        "--socket %s: another daemon is listening there; stop it or choose "
		        "another socket",
		        path);
		return -1;
	}
	if (probe >= 0)
		close(probe);
	unlink(path);
	mode_t old = umask(0117);
	srv->unix_listener = evconnlistener_new_bind(srv->base, on_accept, srv,
	                                             LEV_OPT_CLOSE_ON_EXEC | LEV_OPT_CLOSE_ON_FREE,
	                                             128, (struct sockaddr *)&sun, sizeof(sun));
	umask(old);
	if (!srv->unix_listener) {
		k3d_log(K3D_LOG_ERROR, "--socket %s: %s", path, strerror(errno));
		return -1;
	}
	chmod(path, 0660);
	evconnlistener_set_error_cb(srv->unix_listener, on_accept_error);
	return 0;
}

void k3d_bound_address(evutil_socket_t fd, char *out, size_t outsz)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	socklen_t len = sizeof(ss);
	char host[INET6_ADDRSTRLEN], port[8];
	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0 ||
	    getnameinfo((struct sockaddr *)&ss, len, host, sizeof(host), port, sizeof(port),
	                NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
		snprintf(out, outsz, "?");
		return;
	}
	snprintf(out, outsz, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

static int listen_tcp(struct k3d_server *srv, const struct k3d_addr *a)
{
	srv->tcp_listener = evconnlistener_new_bind(srv->base, on_accept, srv,
	                                            LEV_OPT_CLOSE_ON_EXEC | LEV_OPT_CLOSE_ON_FREE |
	                                                    LEV_OPT_REUSEABLE,
	                                            128, (const struct sockaddr *)&a->sa, a->len);
	if (!srv->tcp_listener) {
		k3d_log(K3D_LOG_ERROR, "--listen %s: %s", a->text, strerror(errno));
		return -1;
	}
	evconnlistener_set_error_cb(srv->tcp_listener, on_accept_error);
	k3d_bound_address(evconnlistener_get_fd(srv->tcp_listener), srv->listen_bound,
	                  sizeof(srv->listen_bound));
	return 0;
}

/* ---- tick and signals ------------------------------------------------------------ */

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct k3d_server *srv = arg;
	srv->ticks++;
	/* budget freed where waiters could not be woken at once (a discard) */
	k3d_conn_resume_waiting(srv);
	/* writes go through the writer thread: the loop never waits for a commit */
	if (!srv->chore_pending && !srv->stopping) {
		struct k3d_job *job = calloc(1, sizeof(*job));
		if (job) {
			k3cache__v1__response__init(&job->resp);
			int sync = srv->cfg.durability == STORE_FAST &&
			           srv->ticks % srv->cfg.sync_interval == 0;
			job->chore = sync ? K3D_CHORE_SYNC : K3D_CHORE_FLUSH;
			srv->chore_pending = 1;
			k3d_writer_submit(srv->writer, job);
		}
	}
	if (srv->ticks % 10 == 0) {
		int dead = store_reader_check(srv->store);
		if (dead)
			k3d_log(K3D_LOG_WARN, "cleared %d reader slots of dead processes", dead);
	}
	if (srv->unix_listener)
		evconnlistener_enable(srv->unix_listener);
	if (srv->tcp_listener)
		evconnlistener_enable(srv->tcp_listener);
	k3d_conn_sweep_timeouts(srv);
	k3d_pool_release_idle(srv);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	(void)what;
	struct k3d_server *srv = arg;
	k3d_log(K3D_LOG_INFO, "%s: stopping (finishing queued commits)",
	        sig == SIGTERM ? "SIGTERM" : "SIGINT");
	(void)sd_notify(0, "STOPPING=1\nSTATUS=stopping: finishing queued commits");
	srv->stopping = 1;
	if (srv->unix_listener) {
		evconnlistener_free(srv->unix_listener);
		srv->unix_listener = NULL;
		unlink(srv->cfg.socket);
	}
	if (srv->tcp_listener) {
		evconnlistener_free(srv->tcp_listener);
		srv->tcp_listener = NULL;
	}
	event_base_loopexit(srv->base, NULL);
}

/* A closed terminal (`make run`) or a habit of `kill -HUP` must not stop the
 * daemon: there is nothing to reload. */
static void on_sighup(evutil_socket_t sig, short what, void *arg)
{
	(void)sig;
	(void)what;
	(void)arg;
	k3d_log(K3D_LOG_WARN, "SIGHUP ignored: k3cached has no configuration file to reload "
	                      "and logs to stderr; SIGTERM or SIGINT stops it");
}

/* ---- run --------------------------------------------------------------------------- */

/* The directory path is in, into dir; 0 when path names none ("s.sock"). */
static int dir_of(const char *path, char *dir, size_t dirsz)
{
	snprintf(dir, dirsz, "%s", path);
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		dir[--n] = 0;
	char *slash = strrchr(dir, '/');
	if (!slash)
		return 0;
	slash[slash == dir ? 1 : 0] = 0;
	return 1;
}

/* A path someone chose (origin: the flag or variable that named it) goes in
 * a directory that exists: a typo must not grow a directory tree. */
static int dir_exists(const char *origin, const char *path)
{
	char dir[4096];
	struct stat sb;
	if (!dir_of(path, dir, sizeof(dir)))
		return 0;
	int found = stat(dir, &sb) == 0;
	if (found && S_ISDIR(sb.st_mode))
		return 0;
	char why[128];
	if (found)
		snprintf(why, sizeof(why), "is not a directory");
	else if (errno == ENOENT)
		snprintf(why, sizeof(why), "does not exist");
	else
		snprintf(why, sizeof(why), "cannot be reached: %s", strerror(errno));
	k3d_log(K3D_LOG_ERROR,
	        "%s %s: the directory %s %s; create it first (k3cached creates only its "
	        "default directories, and the store directory itself)",
	        origin, path, dir, why);
	return -1;
}

/* Before anything is created: the default socket's runtime directory and the
 * default store directory are made as needed (mkdir -p); an explicit
 * --socket's or --db's parent must exist (store_open makes the store
 * directory itself). */
static int make_dirs(const struct k3d_config *cfg)
{
	char dir[4096];
	if (cfg->socket_origin) {
		if (dir_exists(cfg->socket_origin, cfg->socket) != 0)
			return -1;
	} else if (dir_of(cfg->socket, dir, sizeof(dir)) && paths_mkdir_p(dir, 0750) != 0) {
		k3d_log(K3D_LOG_ERROR, "socket %s: cannot create %s: %s", cfg->socket, dir,
		        strerror(errno));
		return -1;
	}
	if (cfg->db_origin)
		return dir_exists(cfg->db_origin, cfg->db);
	if (paths_mkdir_p(cfg->db, 0750) != 0) {
		k3d_log(K3D_LOG_ERROR, "store %s: cannot create: %s", cfg->db, strerror(errno));
		return -1;
	}
	return 0;
}

int k3d_server_run(const struct k3d_config *cfg)
{
	struct k3d_server *srv = calloc(1, sizeof(*srv));
	if (!srv)
		return 1;
	srv->cfg = *cfg;
	srv->done_fd = -1;
	k3d_set_log_level(cfg->log_level);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGHUP, SIG_IGN); /* until on_sighup is in place */
	evthread_use_pthreads();

	if (make_dirs(cfg) != 0) {
		free(srv);
		return 1;
	}
	int tenancy_ok = k3d_tenancy_load(&srv->tenancy, cfg->token_file, cfg->admin_group) == 0;
	srv->tenancy.insecure_tcp = cfg->insecure_tcp;
	uint32_t twice = 0; /* the flags' parse refused a uid in two lists */
	for (int i = 0; tenancy_ok && i < cfg->n_share_uids; i++)
		tenancy_ok = k3d_tenancy_share(&srv->tenancy, cfg->share_uids[i], &twice) == 0;
	if (!tenancy_ok) {
		k3d_tenancy_free(&srv->tenancy);
		free(srv);
		return 1;
	}
	struct store_options so = {.max_bytes = cfg->max_bytes,
	                           .durability = cfg->durability,
	                           .stage_bytes = cfg->stage_bytes,
	                           .row_block = cfg->row_block,
	                           .check = cfg->check};
	struct status st;
	enum status_code code = store_open(cfg->db, &so, &srv->store, &st);
	if (code != STATUS_OK) {
		k3d_log(K3D_LOG_ERROR, "--db %s: %s", cfg->db, st.message);
		k3d_tenancy_free(&srv->tenancy);
		free(srv);
		return code == STATUS_CORRUPT ? K3D_EXIT_DAMAGED : 1;
	}
	int rc = 1;
	srv->started = k3d_now();
	srv->base = event_base_new();
	if (srv->base)
		event_base_priority_init(srv->base, K3D_PRIO_QUEUES);
	if (!srv->base)
		goto out;
	srv->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (srv->done_fd < 0) {
		k3d_log(K3D_LOG_ERROR, "eventfd: %s", strerror(errno));
		goto out;
	}
	srv->done_ev = event_new(srv->base, srv->done_fd, EV_READ | EV_PERSIST, on_done, srv);
	if (srv->done_ev) { /* answers from the writer go out first */
		event_priority_set(srv->done_ev, K3D_PRIO_HIGH);
		event_add(srv->done_ev, NULL);
	}
	srv->writer = k3d_writer_start(srv);
	if (!srv->writer || !srv->done_ev)
		goto out;
	if (listen_unix(srv, cfg->socket) != 0)
		goto out;
	if (cfg->listen.text && listen_tcp(srv, &cfg->listen) != 0)
		goto out;
	if (cfg->metrics.text && k3d_metrics_start(srv) != 0)
		goto out;
	if (k3d_t2_start(srv) != 0)
		goto out;
	srv->sig_term = evsignal_new(srv->base, SIGTERM, on_signal, srv);
	srv->sig_int = evsignal_new(srv->base, SIGINT, on_signal, srv);
	srv->sig_hup = evsignal_new(srv->base, SIGHUP, on_sighup, srv);
	srv->tick = event_new(srv->base, -1, EV_PERSIST, on_tick, srv);
	struct timeval one = {1, 0};
	event_add(srv->sig_term, NULL);
	event_add(srv->sig_int, NULL);
	event_add(srv->sig_hup, NULL);
	event_add(srv->tick, &one);

	struct store_stats stats;
	store_get_stats(srv->store, &stats, NULL);
	char used[32], cap[32];
	units_format_size(stats.bytes, used, sizeof(used));
	units_format_size(cfg->max_bytes, cap, sizeof(cap));
	k3d_log(K3D_LOG_INFO,
	        "%s ready: socket %s%s%s, store %s (%llu entries, %s of %s, durability %s)%s%s",
	        K3D_VERSION, cfg->socket, cfg->listen.text ? ", tcp " : "", srv->listen_bound,
	        cfg->db, (unsigned long long)stats.entries, used, cap,
	        store_durability_name(cfg->durability), cfg->metrics.text ? ", metrics " : "",
	        srv->metrics_bound);
	/* Type=notify: the socket accepts from here on (a no-op outside systemd) */
	(void)sd_notifyf(0, "READY=1\nSTATUS=serving %s: %llu entries, %s of %s", cfg->db,
	                 (unsigned long long)stats.entries, used, cap);
	if (stats.unclean_stop)
		k3d_log(K3D_LOG_WARN,
		        "store %s: the last process to write it did not stop cleanly%s", cfg->db,
		        stats.checked ? "; its structure checks sound" : "");
	if (stats.checked)
		k3d_log(K3D_LOG_INFO, "store %s: structure checked, %llu pages in %llu ms", cfg->db,
		        (unsigned long long)stats.checked_pages,
		        (unsigned long long)stats.check_ms);
	if (cfg->row_block && stats.row_block != cfg->row_block)
		k3d_log(K3D_LOG_WARN,
		        "--row-block %u: store %s was made with blocks of %u rows and keeps them",
		        cfg->row_block, cfg->db, stats.row_block);
	/* the store evicts only to make room for a publish (store_lru_make_room) */
	if (stats.bytes > cfg->max_bytes)
		k3d_log(K3D_LOG_WARN,
		        "store %s holds %s (%llu bytes), over --max-bytes %s (%llu bytes): "
		        "nothing is evicted now; the next publish evicts least-recently-used "
		        "entries until the store and the new snapshot fit in %s (`k3cachectl "
		        "evict --to-size %llu` does it at once)",
		        cfg->db, used, (unsigned long long)stats.bytes, cap,
		        (unsigned long long)cfg->max_bytes, cap,
		        (unsigned long long)cfg->max_bytes);
	event_base_dispatch(srv->base);

	/* stopping: the second tier's threads end their round trips and its
	 * waiting lookups are answered locally; then every queued commit
	 * finishes (a fetched entry queued is stored, its waiters gone) and is
	 * answered if we still can */
	k3d_t2_stop(srv);
	k3d_writer_stop(srv->writer);
	on_done(-1, 0, srv);
	for (struct k3d_conn *c = srv->conns; c; c = c->next)
		evbuffer_write(c->out, c->fd);
	while (srv->conns)
		k3d_conn_close(srv->conns);
	rc = 0;
	k3d_log(K3D_LOG_INFO, "stopped cleanly");
out:
	k3d_t2_stop(srv);
	if (srv->writer) {
		if (rc != 0)
			k3d_writer_stop(srv->writer);
		k3d_writer_free(srv->writer);
	}
	if (srv->unix_listener) {
		evconnlistener_free(srv->unix_listener);
		unlink(cfg->socket);
	}
	if (srv->tcp_listener)
		evconnlistener_free(srv->tcp_listener);
	if (srv->http)
		evhttp_free(srv->http);
	if (srv->sig_term)
		event_free(srv->sig_term);
	if (srv->sig_int)
		event_free(srv->sig_int);
	if (srv->sig_hup)
		event_free(srv->sig_hup);
	if (srv->tick)
		event_free(srv->tick);
	if (srv->done_ev)
		event_free(srv->done_ev);
	if (srv->done_fd >= 0)
		close(srv->done_fd);
	if (srv->base)
		event_base_free(srv->base);
	for (int i = 0; i < srv->pool_n; i++)
		free(srv->pool[i].data);
	store_close(srv->store);
	k3d_tenancy_free(&srv->tenancy);
	k3d_slots_free(&srv->slots);
	free(srv);
	return rc;
}
