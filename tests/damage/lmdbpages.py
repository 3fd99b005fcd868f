"""Just enough of LMDB 0.9's file layout to aim a flipped byte at one part of
a store: a meta page's fields, a named database's pages, a node's header, a
value inline or on its overflow pages. Read-only; the tests write the flip.
(The layout: src/store/walk.c.)"""
import struct

PAGEHDR = 16
P_BRANCH, P_LEAF, P_OVERFLOW = 1, 2, 4
F_BIGDATA, F_SUBDATA, F_DUPDATA = 1, 2, 4
# offsets in a meta page: header, then magic, version, address, mapsize,
# dbs[2] (48 bytes each), last_pg, txnid
META_DBS = PAGEHDR + 24
META_TXNID = PAGEHDR + 128
DB_ROOT = 40  # in an MDB_db


class Store:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        self.psize = struct.unpack_from("<I", self.data, META_DBS)[0]
        t0 = struct.unpack_from("<Q", self.data, META_TXNID)[0]
        t1 = struct.unpack_from("<Q", self.data, self.psize + META_TXNID)[0]
        self.meta = 1 if t1 > t0 else 0  # the page LMDB opens
        self.dbs = {}
        for node in self.leaf_nodes(self.root_of(self.meta_off() + META_DBS + 48)):
            self.dbs[node["key"].decode()] = node["data_off"]

    def meta_off(self):
        return self.meta * self.psize

    def main_root_off(self):
        """Offset of the main database's root page number in the live meta page."""
        return self.meta_off() + META_DBS + 48 + DB_ROOT

    def root_of(self, db_off):
        return struct.unpack_from("<Q", self.data, db_off + DB_ROOT)[0]

    def page(self, pgno):
        off = pgno * self.psize
        _, _, flags, lower, upper = struct.unpack_from("<QHHHH", self.data, off)
        return off, flags, lower, upper

    def nodes(self, pgno):
        off, flags, lower, _ = self.page(pgno)
        for i in range((lower - PAGEHDR) // 2):
            ptr = struct.unpack_from("<H", self.data, off + PAGEHDR + 2 * i)[0]
            n = off + ptr
            lo, hi, fl, ks = struct.unpack_from("<HHHH", self.data, n)
            yield {"page": pgno, "flags": flags, "node_off": n, "nflags": fl,
                   "dsize": lo | hi << 16, "child": lo | hi << 16 | fl << 32,
                   "key": self.data[n + 8:n + 8 + ks], "data_off": n + 8 + ks}

    def leaf_nodes(self, pgno):
        for node in self.nodes(pgno):
            if node["flags"] & P_BRANCH:
                yield from self.leaf_nodes(node["child"])
            else:
                yield node

    def table(self, name):
        """The leaf nodes of a named database."""
        return list(self.leaf_nodes(self.root_of(self.dbs[name])))

    def value_off(self, node):
        """Where a leaf node's value is: inline, or on its overflow pages."""
        if node["nflags"] & F_BIGDATA:
            ov = struct.unpack_from("<Q", self.data, node["data_off"])[0]
            return ov * self.psize + PAGEHDR
        return node["data_off"]

    def overflow_header(self, node):
        """Offset of the page count of a value's overflow run."""
        ov = struct.unpack_from("<Q", self.data, node["data_off"])[0]
        return ov * self.psize + 12

    def last_page(self):
        return struct.unpack_from("<Q", self.data, self.meta_off() + PAGEHDR + 120)[0]

    def pages_of_kind(self, flags):
        return [p for p in range(2, self.last_page() + 1)
                if (p + 1) * self.psize <= len(self.data) and self.page(p)[1] == flags]
