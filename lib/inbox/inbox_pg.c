/* inbox_pg.c — the inbox claim in the caller's PostgreSQL transaction (being written). */
#include "core/error.h"
#include "idem.h"

IDEM_EXTERN idem_rc idem_inbox_claim_pg(struct pg_conn *conn, const char *group,
                                        const char *msg_id, const char *biz_type,
                                        idem_outcome *out)
{
    (void)conn; (void)group; (void)msg_id; (void)biz_type; (void)out;
    return idem__fail(IDEM_ENOTSUP, "not built yet");
}
