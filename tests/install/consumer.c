/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumer.c — a program of a user's own, built against an installed
 * libidem (tests/install/test_install.sh builds it with pkg-config and
 * with find_package(idem CONFIG)): one key claimed, finished, replayed.
 */
#include <idem.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    idem_options o;
    idem_options_init(&o);
    o.path = ":memory:";
    idem *h;
    if (idem_open(&o, &h) != IDEM_OK) {
        fprintf(stderr, "idem_open: %s\n", idem_errdetail());
        return 1;
    }
    idem_outcome out;
    idem_record rec;
    int rc = 1;
    if (idem_record_begin(h, "refund", "R-1", NULL, "me", 30000, &out, &rec) != IDEM_OK ||
        out != IDEM_NEW)
        goto out;
    uint64_t epoch = rec.epoch;
    idem_record_clear(&rec);
    if (idem_record_complete(h, "refund", "R-1", epoch, "done", 4, 0, &out) != IDEM_OK ||
        idem_record_begin(h, "refund", "R-1", NULL, "me", 30000, &out, &rec) != IDEM_OK ||
        out != IDEM_DONE)
        goto out;
    rc = rec.result_len == 4 && memcmp(rec.result, "done", 4) == 0 ? 0 : 1;
    idem_record_clear(&rec);
    printf("consumer: idem %s, %s\n", idem_version(), rc == 0 ? "replayed" : "wrong result");
out:
    idem_close(h);
    return rc;
}
