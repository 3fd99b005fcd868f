/* paths: where a daemon and its clients meet by default. root: /run/k3cache
 * and /var/lib/k3cache; a user: $XDG_RUNTIME_DIR (else /tmp/k3cache-UID) and
 * $XDG_DATA_HOME (else ~/.local/share). $K3CACHE_SOCKET overrides the socket. */
#ifndef K3_PATHS_H
#define K3_PATHS_H

#include <stddef.h>

/* Writes the default socket path into buf and returns buf. */
/* The system daemon's socket (root's default). */
#define PATHS_SYSTEM_SOCKET "/run/k3cache/k3cached.sock"

const char *paths_default_socket(char *buf, size_t bufsz);
/* The socket a client dials by default: $K3CACHE_SOCKET; for root the
 * system daemon's; else this user's daemon's socket if it exists, else the
 * system daemon's (/run/k3cache/k3cached.sock) if that exists, else this
 * user's default path (paths_default_socket()). */
const char *paths_client_socket(char *buf, size_t bufsz);

/* Writes the default store directory into buf and returns buf. */
const char *paths_default_db(char *buf, size_t bufsz);

/* mkdir -p with the given mode for each missing directory. 0 or -1 (errno). */
int paths_mkdir_p(const char *dir, unsigned mode);

#endif
