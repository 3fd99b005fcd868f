#include "paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *paths_default_socket(char *buf, size_t bufsz)
{
	const char *env = getenv("K3CACHE_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (env && *env)
		snprintf(buf, bufsz, "%s", env);
	else if (geteuid() == 0)
		snprintf(buf, bufsz, "%s", PATHS_SYSTEM_SOCKET);
	else if (xdg && *xdg)
		snprintf(buf, bufsz, "%s/k3cache/k3cached.sock", xdg);
	else
		snprintf(buf, bufsz, "/tmp/k3cache-%u/k3cached.sock", (unsigned)geteuid());
	return buf;
}

/* Whether path names a Unix socket. */
static int is_socket(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

const char *paths_client_socket(char *buf, size_t bufsz)
{
	paths_default_socket(buf, bufsz);
	const char *env = getenv("K3CACHE_SOCKET");
	if ((env && *env) || geteuid() == 0 || is_socket(buf))
		return buf;
	if (is_socket(PATHS_SYSTEM_SOCKET))
		snprintf(buf, bufsz, "%s", PATHS_SYSTEM_SOCKET);
	return buf;
}

const char *paths_default_db(char *buf, size_t bufsz)
{
	const char *xdg = getenv("XDG_DATA_HOME");
	const char *home = getenv("HOME");
	if (geteuid() == 0)
		snprintf(buf, bufsz, "/var/lib/k3cache");
	else if (xdg && *xdg)
		snprintf(buf, bufsz, "%s/k3cache", xdg);
	else if (home && *home)
		snprintf(buf, bufsz, "%s/.local/share/k3cache", home);
	else
		snprintf(buf, bufsz, "/tmp/k3cache-%u/db", (unsigned)geteuid());
	return buf;
}

int paths_mkdir_p(const char *dir, unsigned mode)
{
	char tmp[4096];
	if (snprintf(tmp, sizeof(tmp), "%s", dir) >= (int)sizeof(tmp)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(tmp, (mode_t)mode) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(tmp, (mode_t)mode) != 0 && errno != EEXIST)
		return -1;
	return 0;
}
