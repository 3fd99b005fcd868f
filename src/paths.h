/* paths: where a daemon and its clients meet by default. root: /run/k3cache
 * and /var/lib/k3cache; a user: $XDG_RUNTIME_DIR (else /tmp/k3cache-UID) and
 * $XDG_DATA_HOME (else ~/.local/share). $K3CACHE_SOCKET overrides the socket. */
#ifndef K3_PATHS_H
#define K3_PATHS_H

#include <stddef.h>

/* Writes the default socket path into buf and returns buf. */
const char *paths_default_socket(char *buf, size_t bufsz);

/* Writes the default store directory into buf and returns buf. */
const char *paths_default_db(char *buf, size_t bufsz);

/* mkdir -p with the given mode for each missing directory. 0 or -1 (errno). */
int paths_mkdir_p(const char *dir, unsigned mode);

#endif
