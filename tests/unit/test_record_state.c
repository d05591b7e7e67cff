/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the record state machine's transition function, without a
 * store: each row of the picture in lib/record/record_state.c. */
#include <string.h>

#include "record/record_state.h"
#include "testlib.h"

static idem_record row(const char *state, uint64_t epoch, int64_t lease_until)
{
    idem_record r;
    memset(&r, 0, sizeof r);
    strcpy(r.state, state);
    r.epoch = epoch;
    r.lease_until_ms = lease_until;
    return r;
}

static struct idem__rec_event_args begin_ev(const uint8_t *fp)
{
    struct idem__rec_event_args ev = {.kind = IDEM__EV_BEGIN, .space = "s", .key = "k",
                                      .now = 1000, .fingerprint = fp, .owner = "me",
                                      .lease_ms = 500};
    return ev;
}

static void test_begin(void **state)
{
    (void)state;
    struct idem__rec_decision d;
    struct idem__rec_event_args ev = begin_ev(NULL);

    idem__record_decide(&ev, NULL, 0, &d); /* first: insert, never read */
    assert_int_equal(d.action, IDEM__ACT_INSERT);
    assert_int_equal(d.insert.lease_until, 1500);
    assert_int_equal(d.insert.epoch, 1000); /* the clock: never reused */

    idem_record r = row("PROCESSING", 3, 1001);
    idem__record_decide(&ev, &r, 1, &d);
    assert_int_equal(d.action, IDEM__ACT_ANSWER);
    assert_outcome(d.outcome, IDEM_IN_PROGRESS);

    r = row("PROCESSING", 3, 1000); /* lease ends now: take over */
    idem__record_decide(&ev, &r, 1, &d);
    assert_int_equal(d.action, IDEM__ACT_CAS);
    assert_outcome(d.outcome, IDEM_TAKEN_OVER);
    assert_int_equal(d.cas.expect_epoch, 3);
    assert_int_equal(d.cas.epoch, 4);
    assert_int_equal(d.cas.lease_expired_at, 1000);
    assert_string_equal(d.cas.state, "PROCESSING");
    assert_int_equal(d.cas.expires_ms, 0);

    r = row("RELEASED", 2, 0);
    idem__record_decide(&ev, &r, 1, &d);
    assert_int_equal(d.action, IDEM__ACT_CAS);
    assert_outcome(d.outcome, IDEM_NEW);
    assert_int_equal(d.cas.epoch, 3);
    assert_int_equal(d.cas.lease_expired_at, 0);

    const char *done[] = {"SUCCEEDED", "FAILED", "REFUNDED"};
    for (int i = 0; i < 3; i++) {
        r = row(done[i], 1, 0);
        idem__record_decide(&ev, &r, 1, &d);
        assert_int_equal(d.action, IDEM__ACT_ANSWER);
        assert_outcome(d.outcome, IDEM_DONE);
    }
}

static void test_mismatch(void **state)
{
    (void)state;
    uint8_t a[IDEM_FINGERPRINT_LEN] = {1}, b[IDEM_FINGERPRINT_LEN] = {2};
    struct idem__rec_decision d;
    struct idem__rec_event_args ev = begin_ev(b);
    const char *states[] = {"PROCESSING", "SUCCEEDED", "FAILED", "REFUNDED"};
    for (int i = 0; i < 4; i++) {
        idem_record r = row(states[i], 1, 0); /* even with an expired lease */
        r.has_fingerprint = 1;
        memcpy(r.fingerprint, a, sizeof a);
        idem__record_decide(&ev, &r, 1, &d);
        assert_int_equal(d.action, IDEM__ACT_ANSWER);
        assert_outcome(d.outcome, IDEM_MISMATCH);
    }
    /* RELEASED keeps no answer: the other payload claims it, and the
     * claim's update carries its fingerprint. */
    idem_record r = row("RELEASED", 1, 0);
    r.has_fingerprint = 1;
    memcpy(r.fingerprint, a, sizeof a);
    idem__record_decide(&ev, &r, 1, &d);
    assert_int_equal(d.action, IDEM__ACT_CAS);
    assert_outcome(d.outcome, IDEM_NEW);
    assert_string_equal(d.cas.expect_state, "RELEASED");
    assert_int_equal(d.cas.expect_epoch, 1);
    assert_int_equal(d.cas.epoch, 2);
    assert_ptr_equal(d.cas.fingerprint, b);
    /* Without a fingerprint, the stored one is kept. */
    ev = begin_ev(NULL);
    idem__record_decide(&ev, &r, 1, &d);
    assert_outcome(d.outcome, IDEM_NEW);
    assert_null(d.cas.fingerprint);
    /* Any other claim step leaves the fingerprint alone. */
    r = row("PROCESSING", 1, 0);
    idem__record_decide(&ev, &r, 1, &d);
    assert_outcome(d.outcome, IDEM_TAKEN_OVER);
    assert_null(d.cas.fingerprint);
}

static void test_finish_and_transition(void **state)
{
    (void)state;
    struct idem__rec_decision d;
    struct idem__rec_event_args ev = {.kind = IDEM__EV_FAIL_RETRYABLE, .space = "s", .key = "k",
                                      .now = 1000, .epoch = 7, .retention_ms = 60};
    idem__record_decide(&ev, NULL, 0, &d);
    assert_int_equal(d.action, IDEM__ACT_CAS);
    assert_string_equal(d.cas.expect_state, "PROCESSING");
    assert_int_equal(d.cas.expect_epoch, 7);
    assert_string_equal(d.cas.state, "RELEASED");
    assert_int_equal(d.cas.expires_ms, 1060);
    idem_record r = row("SUCCEEDED", 7, 0);
    idem__record_decide(&ev, &r, 1, &d);
    assert_outcome(d.outcome, IDEM_CONFLICT);
    idem__record_decide(&ev, &r, 0, &d);
    assert_outcome(d.outcome, IDEM_NOT_FOUND);

    ev.kind = IDEM__EV_COMPLETE;
    idem__record_decide(&ev, NULL, 0, &d);
    assert_string_equal(d.cas.state, "SUCCEEDED");
    ev.kind = IDEM__EV_FAIL_FINAL;
    idem__record_decide(&ev, NULL, 0, &d);
    assert_string_equal(d.cas.state, "FAILED");

    struct idem__rec_event_args t = {.kind = IDEM__EV_TRANSITION, .space = "s", .key = "k",
                                     .now = 1, .from = "PAID", .to = "REFUNDED"};
    idem__record_decide(&t, NULL, 0, &d);
    assert_int_equal(d.action, IDEM__ACT_CAS);
    assert_string_equal(d.cas.expect_state, "PAID");
    assert_int_equal(d.cas.expect_epoch, 0);
    assert_int_equal(d.cas.epoch, 0); /* kept */
    assert_int_equal(d.cas.set_result, 0);
    assert_int_equal(d.cas.expires_ms, -1);
    r = row("REFUNDED", 1, 0);
    idem__record_decide(&t, &r, 1, &d);
    assert_outcome(d.outcome, IDEM_ALREADY);
    r = row("CANCELLED", 1, 0);
    idem__record_decide(&t, &r, 1, &d);
    assert_outcome(d.outcome, IDEM_CONFLICT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_begin),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_finish_and_transition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
