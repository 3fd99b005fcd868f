/* Replies recorded from a real Redis 7.0 cluster (redis-cli --cluster create
 * on 127.0.0.1), byte for byte as redis-server sent them: for
 * tests/unit/test_cluster.c and the seeds of tests/fuzz/fuzz_cluster.c. */
#ifndef K3_CLUSTER_REPLIES_H
#define K3_CLUSTER_REPLIES_H

/* CLUSTER SLOTS of 3 masters (redis-cli --cluster create, no replicas) */
static const char slots_3masters[] =
        "*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:17101\r\n"
        "$40\r\nf00cdca66a6f3dd31a8e3e193ee8490ad697e19d\r\n*0\r\n*3\r\n"
        ":5461\r\n:10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:17102\r\n$40\r\n"
        "051ccb7c33a614d0e537375a4510f7576a550a6f\r\n*0\r\n*3\r\n:10923\r\n"
        ":16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:17103\r\n$"
        "40\r\n1d5864234ffa7863b850c3b77ffb05f9ca4ba184\r\n"
        "*0\r\n";

/* 3 masters with a replica each; the first master announces a hostname
 * (metadata "hostname") while the preferred endpoint is its IP */
static const char slots_replicas[] =
        "*3\r\n*4\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:17104\r\n"
        "$40\r\n7216199b89ab839bbe33751858d16052d0eda38a\r\n*2\r\n$8\r\n"
        "hostname\r\n$14\r\nnode-a.example\r\n*4\r\n$9\r\n127.0.0.1\r\n"
        ":17107\r\n$40\r\nd44c2a1778cdc293938d7d58a4a137320a36deac\r\n"
        "*0\r\n*4\r\n:5461\r\n:10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:17105\r\n"
        "$40\r\n3e9481d8b02330b9f3b17a06996bb50b4aea7cd3\r\n*0\r\n*4\r\n"
        "$9\r\n127.0.0.1\r\n:17108\r\n$40\r\n90bfaa113c2d4fdf677a93bf2573fa34b898501b\r\n"
        "*0\r\n*4\r\n:10923\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:17106\r\n"
        "$40\r\n9d6eb4d8089699c4d3f7ae2f9e1b10a98c399a71\r\n*0\r\n*4\r\n"
        "$9\r\n127.0.0.1\r\n:17109\r\n$40\r\n657858dcd61ef0581079b7c94659cb3d7810e2aa\r\n"
        "*0\r\n";

/* the same cluster with cluster-preferred-endpoint-type unknown-endpoint:
 * nil endpoints (the node asked), the IP in the metadata */
static const char slots_nil_hosts[] =
        "*3\r\n*4\r\n:0\r\n:5460\r\n*4\r\n$-1\r\n:17104\r\n"
        "$40\r\n7216199b89ab839bbe33751858d16052d0eda38a\r\n*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
        "*4\r\n$-1\r\n:17107\r\n$40\r\nd44c2a1778cdc293938d7d58a4a137320a36deac\r\n"
        "*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
        "*4\r\n:5461\r\n:10922\r\n*4\r\n$-1\r\n:17105\r\n"
        "$40\r\n3e9481d8b02330b9f3b17a06996bb50b4aea7cd3\r\n*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
        "*4\r\n$-1\r\n:17108\r\n$40\r\n90bfaa113c2d4fdf677a93bf2573fa34b898501b\r\n"
        "*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
        "*4\r\n:10923\r\n:16383\r\n*4\r\n$-1\r\n:17106\r\n"
        "$40\r\n9d6eb4d8089699c4d3f7ae2f9e1b10a98c399a71\r\n*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
        "*4\r\n$-1\r\n:17109\r\n$40\r\n657858dcd61ef0581079b7c94659cb3d7810e2aa\r\n"
        "*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n";

/* with cluster-preferred-endpoint-type hostname: the first master has one,
 * the others are "?" (unknown) with their IP in the metadata; the third
 * master's metadata is cut down to none here, so its slots stay unknown */
static const char slots_unknown_hosts[] =
        "*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$14\r\nnode-a.example\r\n:17104\r\n"
        "$40\r\n7216199b89ab839bbe33751858d16052d0eda38a\r\n*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
        "*3\r\n:5461\r\n:10922\r\n*4\r\n$1\r\n?\r\n:17105\r\n"
        "$40\r\n3e9481d8b02330b9f3b17a06996bb50b4aea7cd3\r\n*2\r\n$2\r\nip\r\n$9\r\n127.0.0.2\r\n"
        "*3\r\n:10923\r\n:16383\r\n*4\r\n$1\r\n?\r\n:17106\r\n"
        "$40\r\n9d6eb4d8089699c4d3f7ae2f9e1b10a98c399a71\r\n*0\r\n";

/* error replies as redis-server sent them */
static const char moved_reply[] = "-MOVED 12182 127.0.0.1:17103\r\n";
static const char ask_reply[] = "-ASK 12182 127.0.0.1:17102\r\n";
static const char moved_empty_host[] = "-MOVED 12182 :17106\r\n";
static const char moved_unknown_host[] = "-MOVED 12182 ?:17106\r\n";

#endif
