/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon.c — what every part of idem serve shares (daemon.h): the current
 * configuration and its references, the answer, the store's write health,
 * a loop's settling. Where a request goes is dispatch.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/libevent.h"
#include "daemon.h"

/* ---- the configuration, answers, write health ---- */

struct live_config *daemon_config_get(struct daemon *d)
{
    pthread_mutex_lock(&d->cfg_mu);
    struct live_config *lc = d->live;
    atomic_fetch_add(&lc->refs, 1);
    pthread_mutex_unlock(&d->cfg_mu);
    return lc;
}

void daemon_config_put(struct live_config *lc)
{
    if (lc && atomic_fetch_sub(&lc->refs, 1) == 1) {
        config_free(lc->c);
        free(lc);
    }
}

struct live_config *daemon_config_ref(struct live_config *lc)
{
    atomic_fetch_add(&lc->refs, 1);
    return lc;
}

void daemon_answer(struct live_config *lc, struct front_request *req, struct http_response *r)
{
    daemon_config_put(lc);
    req->resp = r;
    front_answer(req);
}

void daemon_loop_settle(struct daemon_loop *l)
{
    if (!l->iloop)
        return;
    idem_loop_detach(l->d->h, l->iloop);
    idem_libevent_drain(l->iloop);
}

void daemon_write_ok(struct daemon *d)
{
    /* A load first: every request passes here, and the flag rarely changes. */
    if (atomic_load_explicit(&d->writes_failing, memory_order_relaxed))
        atomic_store(&d->writes_failing, 0);
}

void daemon_write_failed(struct daemon *d, idem_rc rc)
{
    /* Not the request's fault (too big, invalid): the store's. */
    if (rc == IDEM_ESTORE || rc == IDEM_ETIMEDOUT || rc == IDEM_EUNAVAILABLE)
        atomic_store(&d->writes_failing, 1);
}
