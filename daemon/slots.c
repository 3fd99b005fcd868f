/* slots: the restores each tenant has streaming (slots.h). A tenant is
 * listed while it holds one; --max-restores bounds the list, so a linear
 * search is enough. */
#include "slots.h"

#include <stdlib.h>
#include <string.h>

static struct k3d_slot *find(const struct k3d_slots *s, const char *ns, size_t ns_len)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i].ns_len == ns_len && !memcmp(s->v[i].ns, ns, ns_len))
			return &s->v[i];
	return NULL;
}

uint32_t k3d_slots_held(const struct k3d_slots *s, const char *ns, size_t ns_len)
{
	const struct k3d_slot *t = find(s, ns, ns_len);
	return t ? t->held : 0;
}

int k3d_slots_take(struct k3d_slots *s, const char *ns, size_t ns_len)
{
	struct k3d_slot *t = find(s, ns, ns_len);
	if (!t) {
		if (ns_len > sizeof(t->ns))
			return -1;
		if (s->n == s->cap) {
			size_t cap = s->cap ? s->cap * 2 : 8;
			struct k3d_slot *v = realloc(s->v, cap * sizeof(*v));
			if (!v)
				return -1;
			s->v = v;
			s->cap = cap;
		}
		t = &s->v[s->n++];
		memcpy(t->ns, ns, ns_len);
		t->ns_len = ns_len;
		t->held = 0;
	}
	t->held++;
	return 0;
}

void k3d_slots_give(struct k3d_slots *s, const char *ns, size_t ns_len)
{
	struct k3d_slot *t = find(s, ns, ns_len);
	if (!t || --t->held > 0)
		return;
	*t = s->v[--s->n]; /* unlisted: the last takes its place */
}

void k3d_slots_free(struct k3d_slots *s)
{
	free(s->v);
	memset(s, 0, sizeof(*s));
}
