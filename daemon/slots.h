/* slots: the restores each tenant has streaming (slots.c), so that one tenant
 * (a namespace, tenancy.h; admins share the empty one) cannot hold every
 * --max-restores slot and answer everyone else BUSY. The loop thread's. */
#ifndef K3_DAEMON_SLOTS_H
#define K3_DAEMON_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "tenancy.h"

struct k3d_slot {
	char ns[K3D_NS_MAX];
	size_t ns_len;
	uint32_t held;
};

/* The tenants holding a slot now (none held: not listed). */
struct k3d_slots {
	struct k3d_slot *v;
	size_t n, cap;
};

/* Restores ns has streaming now. */
uint32_t k3d_slots_held(const struct k3d_slots *s, const char *ns, size_t ns_len);
/* Counts one more for ns: 0, or -1 out of memory (nothing counted). */
int k3d_slots_take(struct k3d_slots *s, const char *ns, size_t ns_len);
/* Counts one fewer for ns (one k3d_slots_take gave). */
void k3d_slots_give(struct k3d_slots *s, const char *ns, size_t ns_len);
void k3d_slots_free(struct k3d_slots *s);

#endif
