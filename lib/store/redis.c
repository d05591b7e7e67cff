/* redis.c — the "redis" kv backend (being written). */
#include "core/error.h"
#include "store.h"

idem_rc idem__redis_open(const idem_options *o, const struct idem__kv_ops **ops, void **out)
{
    (void)o; (void)ops; (void)out;
    return idem__fail(IDEM_ENOTSUP, "store: the redis backend is not built yet");
}
