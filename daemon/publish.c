/* publish: a publish held whole, from its payload to its answer. The loop
 * receives it (conn.c) and hands it to the writer, which turns consecutive
 * ones into one batch and one commit (writer.c); a delta's whole blobs are
 * assembled from its base first. A publish larger than the stage size is
 * streamed instead (ingest.c), from the same store request. The loop
 * answers each with its key, or its error. */
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "service.h"

/* The store request of publish p, its layers pointing into payload (NULL:
 * not arrived, for a check of the header alone). */
static struct store_blob *publish_request(const K3cache__V1__Publish *p,
                                          const unsigned char *payload,
                                          struct store_publish_req *req)
{
	struct store_blob *blobs = calloc(p->n_layers ? p->n_layers : 1, sizeof(*blobs));
	uint64_t off = 0;
	for (size_t l = 0; blobs && l < p->n_layers; l++) {
		blobs[l].data = payload ? payload + off : NULL;
		blobs[l].size = p->layers[l]->size;
		blobs[l].xxh3 = p->layers[l]->xxh3;
		off += p->layers[l]->size;
	}
	*req = (struct store_publish_req){
	        .fingerprint = p->model.data,
	        .salt = p->salt.data,
	        .salt_len = p->salt.len,
	        .tokens = p->tokens,
	        .n_tokens = (uint32_t)p->n_tokens,
	        .blobs = blobs,
	        .n_blobs = blobs ? (uint32_t)p->n_layers : 0,
	};
	return blobs;
}

struct store_blob *k3d_publish_request(const struct k3d_job *job, struct store_publish_req *req)
{
	return publish_request(job->req->publish, job->payload, req);
}

enum status_code k3d_publish_precheck(struct k3d_server *srv, const frame_request *req,
                                      struct status *st)
{
	struct store_publish_req r;
	struct store_blob *blobs = publish_request(req->publish, NULL, &r);
	if (!blobs)
		return status_set(st, STATUS_BUSY, "out of memory; retry later");
	enum status_code code = store_publish_precheck(srv->store, &r, st);
	free(blobs);
	return code;
}

void k3d_publish_batch(struct k3d_server *srv, struct k3d_job **jobs, uint32_t n)
{
	struct store_publish_req reqs[K3D_PUBLISH_BATCH_MAX] = {0};
	struct store_publish_res res[K3D_PUBLISH_BATCH_MAX] = {0};
	struct status sts[K3D_PUBLISH_BATCH_MAX];
	struct store_blob *blobs[K3D_PUBLISH_BATCH_MAX];
	struct store_delta deltas[K3D_PUBLISH_BATCH_MAX] = {0};
	uint32_t go[K3D_PUBLISH_BATCH_MAX], m = 0; /* the jobs that reach the store */
	for (uint32_t i = 0; i < n; i++) {
		blobs[i] = k3d_publish_request(jobs[i], &reqs[i]);
		const K3cache__V1__Publish *p = jobs[i]->req->publish;
		if (p->base_key.len && blobs[i]) {
			/* a delta: the whole blobs from its base and its rows */
			int refused = 0;
			if (store_delta_assemble(srv->store, &reqs[i], p->base_key.data,
			                         p->base_rows, &deltas[i], &refused,
			                         &jobs[i]->st) != STATUS_OK) {
				jobs[i]->delta_refused = refused;
				continue;
			}
			reqs[i].blobs = deltas[i].blobs;
			uint64_t bytes = 0;
			for (uint32_t l = 0; l < reqs[i].n_blobs; l++)
				bytes += reqs[i].blobs[l].size;
			if (bytes > store_stage_bytes(srv->store)) {
				/* staged: published alone, its assembled rows freed before
				 * the next delta is assembled */
				store_publish(srv->store, &reqs[i], &jobs[i]->pub, &jobs[i]->st);
				store_delta_free(&deltas[i]);
				continue;
			}
		}
		reqs[m] = reqs[i];
		go[m++] = i;
	}
	store_publish_batch(srv->store, reqs, res, sts, m);
	for (uint32_t j = 0; j < m; j++) {
		jobs[go[j]]->st = sts[j];
		jobs[go[j]]->pub = res[j];
	}
	for (uint32_t i = 0; i < n; i++) {
		free(blobs[i]);
		store_delta_free(&deltas[i]);
	}
}

void k3d_publish_answer(struct k3d_job *job)
{
	struct k3d_conn *c = job->conn;
	frame_response *r = &job->resp;
	if (job->req->publish->base_key.len) {
		c->srv->delta_publishes++;
		c->srv->delta_refused += job->delta_refused != 0;
	}
	if (job->st.code != STATUS_OK) {
		service_fail(r, &job->st);
		r->delta_refused = job->delta_refused != 0;
		k3d_log(k3d_status_level(job->st.code), "conn %llu (%s): publish: %s: %s",
		        (unsigned long long)c->id, c->peer, status_code_name(job->st.code),
		        job->st.message);
	} else {
		r->key.data = malloc(32);
		if (r->key.data) {
			memcpy(r->key.data, job->pub.key, 32);
			r->key.len = 32;
		}
		r->created = job->pub.created;
		if (job->pub.created) /* the second tier gets a copy (t2.h) */
			k3d_t2_copy(c->srv, job->pub.key);
		r->bytes = job->pub.bytes;
		r->evicted = job->pub.evicted;
	}
}
