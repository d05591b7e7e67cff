# SPDX-License-Identifier: Apache-2.0
# idemConfig.cmake — find_package(idem CONFIG): the target idem::idem, the
# shared libidem with its header (include/idem.h). Its own dependencies
# (SQLite, OpenSSL's libcrypto, hiredis, libpq) are linked into it.
include("${CMAKE_CURRENT_LIST_DIR}/idemTargets.cmake")
set(idem_VERSION 0.1.0)
