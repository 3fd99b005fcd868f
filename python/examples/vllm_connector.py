"""A sketch of a k3cache connector in the shape of vLLM's KV-connector API
(KVConnectorBase_V1), for a hybrid model whose per-layer state is a KDA
(conv, recurrent) pair or an MLA (k, v) pair of float32 arrays.

It runs over numpy buffers and needs no vLLM: python/tests/test_connector.py
drives it the way the scheduler and the model runner would.

    scheduler: get_num_new_matched_tokens(request, num_computed_tokens)
               -> a lookup: how many prompt tokens the cache holds
    worker:    start_load_kv(request)        -> a restore into the layers' buffers
               wait_for_layer_load(layer)    -> returns once that layer is in place
               save_kv_layer(layer, state)   -> collects the layer's arrays
               wait_for_save()               -> one publish of the whole state

A hybrid model's recurrent state exists only whole, at one position, so a
load is of every layer at once (one restore), and a save is of the state
after the last token of the prefill (one publish, a delta from the entry it
was loaded from when there is one).

The cache is an accelerator, never a dependency of serving: a lookup that
fails (the daemon restarting, say) is a miss, and a save that fails is
skipped, with one warning per outage (logger "vllm_connector"), as k3worker
recomputes without the cache. Making the connector asks nothing of the
daemon: its first call on the cache connects and puts the model, so an engine
starts while the daemon is down (an outage from the start), and the call that
first reaches the daemon begins using it. The k3cache.Client connects again
by itself on the call after it lost its connection, so the connector picks up
when the daemon is back. A restore that fails after its lookup hit is raised by
wait_for_layer_load: the buffers are then undefined and the engine must
recompute those tokens.
"""
import logging
import threading

import k3cache

log = logging.getLogger(__name__)


class Request:
    """What the connector needs of vLLM's Request."""

    def __init__(self, request_id, prompt_token_ids):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)


class K3CacheConnector:
    def __init__(self, model_spec, layer_names, buffers, addr=None, salt=b""):
        """layer_names: the model's layers in order; buffers(P) -> the
        engine's per-layer (a, b) arrays sized for P tokens, which restores
        fill in place. addr: as k3cache.Client's (None: $K3CACHE_SOCKET, then
        the default socket, read at the first connect). Nothing is sent
        here: the daemon may be down (see _cache)."""
        self.addr = addr
        self.client = None  # the k3cache.Client, once a connect worked
        self.model_spec = model_spec
        self.fp = None  # the model's fingerprint, once it was put
        self.layer_names = list(layer_names)
        self.buffers = buffers
        self.salt = salt
        self._hits = {}  # request_id -> LookupResult
        self._loaded = {}  # request_id -> (key, P)
        self._ready = threading.Event()
        self._load_error = None
        self._saved = {}
        self._save_request = None
        self._failing = False  # the last call on the cache failed: an outage

    def close(self):
        if self.client is not None:
            self.client.close()

    def _cache(self):
        """The Client, with the model put: the first call on the cache
        connects and puts the model, the calls after it until that worked
        try again. Raises k3cache.Error while the daemon cannot be reached,
        which the callers take for an outage."""
        if self.client is None:
            self.client = k3cache.Client(self.addr)
        if self.fp is None:
            self.fp = self.client.put_model(self.model_spec)
        return self.client

    def _failed(self, doing, e):
        """A call on the cache failed; serving goes on without it. Warns on
        the first failure after a call that worked (once per outage)."""
        if not self._failing:
            log.warning("k3cache: %s failed, going on without the cache: %s", doing, e)
        else:
            log.debug("k3cache: %s failed: %s", doing, e)
        self._failing = True

    def _worked(self):
        if self._failing:
            log.info("k3cache: the cache answers again")
        self._failing = False

    # ---- scheduler side ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens the cache can provide beyond num_computed_tokens, whether
        they load asynchronously). The cache failing is a miss."""
        try:
            client = self._cache()
            r = client.lookup(self.fp, request.prompt_token_ids, salt=self.salt)
        except k3cache.Error as e:
            self._failed("lookup", e)
            return 0, False
        self._worked()
        if r.prefix_len <= num_computed_tokens:
            return 0, False
        self._hits[request.request_id] = r
        return r.prefix_len - num_computed_tokens, False

    # ---- worker side: load ----
    def start_load_kv(self, request):
        """Restores the entry found for the request into the engine's
        buffers (all layers: one validated restore)."""
        self._ready.clear()
        self._load_error = None
        hit = self._hits.pop(request.request_id, None)
        if hit is None:
            self._ready.set()
            return None
        layers = self.buffers(hit.prefix_len)
        try:
            p = self.client.restore_into(hit.key, layers, fp=self.fp)
            self._loaded[request.request_id] = (hit.key, p)
            self._worked()
        except k3cache.Error as e:  # wait_for_layer_load raises it: recompute
            self._failed("restore", e)
            self._load_error = e
        finally:
            self._ready.set()
        return layers

    def wait_for_layer_load(self, layer_name):
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

    # ---- worker side: save ----
    def save_kv_layer(self, layer_name, state, request):
        """state: the layer's (a, b) arrays after the request's prompt."""
        self._save_request = request
        self._saved[layer_name] = state

    def wait_for_save(self):
        """Publishes the collected layers: a delta from the loaded entry when
        the state was restored from one. Returns the entry's key, or None
        when the cache failed (the state is not saved; serving goes on)."""
        req = self._save_request
        layers = [self._saved[n] for n in self.layer_names]
        self._saved = {}
        base_key, base_rows = self._loaded.pop(req.request_id, (None, 0))
        def publish():
            return self.client.publish(self.fp, req.prompt_token_ids, layers, salt=self.salt,
                                       base_key=base_key, base_rows=base_rows)
        try:
            self._cache()
            try:
                key = publish()
            except k3cache.UnknownModelError:
                # a daemon back on an empty store (a host replaced, a store
                # wiped) knows no model: put it again (nothing was stored)
                self.client.put_model(self.model_spec)
                key = publish()
        except k3cache.Error as e:
            self._failed("save", e)
            return None
        self._worked()
        return key
