/* ops: every request op of the protocol, in one list (ops.h). */
#include "ops.h"

const struct ops_row ops_table[OPS_N] = {
#define OPS_ROW(NAME, name, payload, writer, db)                                                   \
	[OPS_##NAME] = {K3CACHE__V1__REQUEST__OP_##NAME, #name, payload, writer, db},
        OPS_LIST(OPS_ROW)
#undef OPS_ROW
                [OPS_UNKNOWN] = {0, "unknown", 0, 0, 0},
};

enum ops_id ops_of(const frame_request *req)
{
	for (int i = 0; i < OPS_UNKNOWN; i++)
		if ((int)req->op_case == ops_table[i].op_case)
			return (enum ops_id)i;
	return OPS_UNKNOWN;
}

const char *ops_name(const frame_request *req)
{
	return ops_table[ops_of(req)].name;
}
