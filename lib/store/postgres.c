/* postgres.c — the "postgres" db backend (being written). */
#include "core/error.h"
#include "store.h"

idem_rc idem__postgres_open(const idem_options *o, const struct idem__db_ops **ops,
                            void **out)
{
    (void)o; (void)ops; (void)out;
    return idem__fail(IDEM_ENOTSUP, "store: the postgres backend is not built yet");
}
