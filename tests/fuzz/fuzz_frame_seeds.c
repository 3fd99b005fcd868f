/* Writes seed frames for fuzz_frame into DIR: one of each op, a publish with
 * its payload, and a pipelined pair. usage: fuzz_frame_seeds DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

static void put(const char *dir, const char *name, const unsigned char *a, size_t an,
                const unsigned char *b, size_t bn)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f)
		exit(1);
	fwrite(a, 1, an, f);
	if (b)
		fwrite(b, 1, bn, f);
	fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	const char *dir = argv[1];
	unsigned char *buf, *buf2;
	size_t n, n2;
	uint8_t key[32] = {1, 2, 3};
	uint32_t tokens[4] = {1, 2, 3, 4};

	frame_request hello = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Hello h = K3CACHE__V1__HELLO__INIT;
	h.protocol = 1;
	h.client = (char *)"seed";
	hello.id = 1;
	hello.op_case = K3CACHE__V1__REQUEST__OP_HELLO;
	hello.hello = &h;
	n = frame_encode_request(&hello, &buf);
	put(dir, "hello", buf, n, NULL, 0);

	frame_request lookup = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Lookup l = K3CACHE__V1__LOOKUP__INIT;
	l.model.data = key;
	l.model.len = 32;
	l.tokens = tokens;
	l.n_tokens = 4;
	l.restore = 1;
	lookup.id = 2;
	lookup.op_case = K3CACHE__V1__REQUEST__OP_LOOKUP;
	lookup.lookup = &l;
	n2 = frame_encode_request(&lookup, &buf2);
	put(dir, "lookup", buf2, n2, NULL, 0);
	put(dir, "pipelined", buf, n, buf2, n2);
	free(buf);
	free(buf2);

	frame_request pub = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Publish p = K3CACHE__V1__PUBLISH__INIT;
	K3cache__V1__LayerRef r0 = K3CACHE__V1__LAYER_REF__INIT, *refs[1] = {&r0};
	unsigned char blob[1 + 8 + 8] = {1, 1, 0, 0, 0, 0, 0, 128, 63, 1, 0, 0, 0, 0, 0, 0, 64};
	r0.index = 0;
	r0.size = sizeof(blob);
	p.model.data = key;
	p.model.len = 32;
	p.tokens = tokens;
	p.n_tokens = 4;
	p.layers = refs;
	p.n_layers = 1;
	pub.id = 3;
	pub.payload_len = sizeof(blob);
	pub.op_case = K3CACHE__V1__REQUEST__OP_PUBLISH;
	pub.publish = &p;
	n = frame_encode_request(&pub, &buf);
	put(dir, "publish", buf, n, blob, sizeof(blob));
	free(buf);

	/* long prompts: the tokens fast path of the codec (frame_tokens.c) */
	uint32_t many[300];
	for (uint32_t i = 0; i < 300; i++)
		many[i] = i * 977u;
	l.tokens = many;
	l.n_tokens = 300;
	l.limit = 299;
	n = frame_encode_request(&lookup, &buf);
	put(dir, "lookup-long", buf, n, NULL, 0);
	free(buf);
	p.tokens = many;
	p.n_tokens = 300;
	n = frame_encode_request(&pub, &buf);
	put(dir, "publish-long", buf, n, blob, sizeof(blob));
	free(buf);

	frame_request ev = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Evict e = K3CACHE__V1__EVICT__INIT;
	ProtobufCBinaryData keys[1] = {{32, key}};
	e.keys = keys;
	e.n_keys = 1;
	e.dry_run = 1;
	ev.id = 4;
	ev.op_case = K3CACHE__V1__REQUEST__OP_EVICT;
	ev.evict = &e;
	n = frame_encode_request(&ev, &buf);
	put(dir, "evict", buf, n, NULL, 0);
	free(buf);
	return 0;
}
