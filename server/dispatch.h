/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dispatch.h — where each request of idem serve goes (dispatch.c): the
 * handler the front end runs on the loop for every request.
 */
#ifndef IDEM_SERVER_DISPATCH_H
#define IDEM_SERVER_DISPATCH_H

#include "http/front.h"

/* arg: the struct daemon. Loop thread. */
void dispatch_request(void *arg, struct front_request *req);

#endif
