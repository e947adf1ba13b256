/* nbd.h: every magic number, code and flag of the NBD protocol, named as in
 * the spec (shared reference nbd-proto.md and the extended-headers text).
 * Nothing else in the tree may spell one of these values. */
#ifndef NBDFLOW_PROTO_NBD_H
#define NBDFLOW_PROTO_NBD_H

#include <stdint.h>

#define NBD_DEFAULT_PORT 10809

/* Handshake magics (§Handshake). */
#define NBD_INIT_PASSWD    UINT64_C(0x4e42444d41474943) /* "NBDMAGIC" */
#define NBD_CLISERV_MAGIC  UINT64_C(0x00420281861253)   /* oldstyle */
#define NBD_IHAVEOPT       UINT64_C(0x49484156454F5054) /* "IHAVEOPT" */
#define NBD_REP_MAGIC      UINT64_C(0x0003e889045565a9)

/* Transmission magics (§Transmission, §ext:Request message). */
#define NBD_REQUEST_MAGIC          UINT32_C(0x25609513)
#define NBD_EXTENDED_REQUEST_MAGIC UINT32_C(0x21e41c71)
#define NBD_SIMPLE_REPLY_MAGIC     UINT32_C(0x67446698)
#define NBD_STRUCTURED_REPLY_MAGIC UINT32_C(0x668e33ef)
#define NBD_EXTENDED_REPLY_MAGIC   UINT32_C(0x6e8a278c)

/* Handshake flags, server (u16). */
#define NBD_FLAG_FIXED_NEWSTYLE (1u << 0)
#define NBD_FLAG_NO_ZEROES      (1u << 1)
/* Client flags (u32). */
#define NBD_FLAG_C_FIXED_NEWSTYLE (1u << 0)
#define NBD_FLAG_C_NO_ZEROES      (1u << 1)

/* Options (§Option types). */
#define NBD_OPT_EXPORT_NAME       1
#define NBD_OPT_ABORT             2
#define NBD_OPT_LIST              3
#define NBD_OPT_PEEK_EXPORT       4 /* withdrawn */
#define NBD_OPT_STARTTLS          5
#define NBD_OPT_INFO              6
#define NBD_OPT_GO                7
#define NBD_OPT_STRUCTURED_REPLY  8
#define NBD_OPT_LIST_META_CONTEXT 9
#define NBD_OPT_SET_META_CONTEXT  10
#define NBD_OPT_EXTENDED_HEADERS  11

/* Option reply types (§Option reply types). */
#define NBD_REP_ACK                 1
#define NBD_REP_SERVER              2
#define NBD_REP_INFO                3
#define NBD_REP_META_CONTEXT        4
#define NBD_REP_FLAG_ERROR          (UINT32_C(1) << 31)
#define NBD_REP_ERR_UNSUP           (NBD_REP_FLAG_ERROR | 1)
#define NBD_REP_ERR_POLICY          (NBD_REP_FLAG_ERROR | 2)
#define NBD_REP_ERR_INVALID         (NBD_REP_FLAG_ERROR | 3)
#define NBD_REP_ERR_PLATFORM        (NBD_REP_FLAG_ERROR | 4)
#define NBD_REP_ERR_TLS_REQD        (NBD_REP_FLAG_ERROR | 5)
#define NBD_REP_ERR_UNKNOWN         (NBD_REP_FLAG_ERROR | 6)
#define NBD_REP_ERR_SHUTDOWN        (NBD_REP_FLAG_ERROR | 7)
#define NBD_REP_ERR_BLOCK_SIZE_REQD (NBD_REP_FLAG_ERROR | 8)
#define NBD_REP_ERR_TOO_BIG         (NBD_REP_FLAG_ERROR | 9)
#define NBD_REP_ERR_EXT_HEADER_REQD (NBD_REP_FLAG_ERROR | 10)

/* NBD_REP_INFO types (§NBD_REP_INFO). */
#define NBD_INFO_EXPORT      0
#define NBD_INFO_NAME        1
#define NBD_INFO_DESCRIPTION 2
#define NBD_INFO_BLOCK_SIZE  3

/* Transmission flags (u16, §Transmission flags). */
#define NBD_FLAG_HAS_FLAGS            (1u << 0)
#define NBD_FLAG_READ_ONLY            (1u << 1)
#define NBD_FLAG_SEND_FLUSH           (1u << 2)
#define NBD_FLAG_SEND_FUA             (1u << 3)
#define NBD_FLAG_ROTATIONAL           (1u << 4)
#define NBD_FLAG_SEND_TRIM            (1u << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES    (1u << 6)
#define NBD_FLAG_SEND_DF              (1u << 7)
#define NBD_FLAG_CAN_MULTI_CONN       (1u << 8)
#define NBD_FLAG_SEND_RESIZE          (1u << 9)
#define NBD_FLAG_SEND_CACHE           (1u << 10)
#define NBD_FLAG_SEND_FAST_ZERO       (1u << 11)
#define NBD_FLAG_BLOCK_STATUS_PAYLOAD (1u << 12)

/* Commands (§Request types). */
#define NBD_CMD_READ         0
#define NBD_CMD_WRITE        1
#define NBD_CMD_DISC         2
#define NBD_CMD_FLUSH        3
#define NBD_CMD_TRIM         4
#define NBD_CMD_CACHE        5
#define NBD_CMD_WRITE_ZEROES 6
#define NBD_CMD_BLOCK_STATUS 7
#define NBD_CMD_RESIZE       8

/* Command flags (§Command flags). */
#define NBD_CMD_FLAG_FUA         (1u << 0)
#define NBD_CMD_FLAG_NO_HOLE     (1u << 1)
#define NBD_CMD_FLAG_DF          (1u << 2)
#define NBD_CMD_FLAG_REQ_ONE     (1u << 3)
#define NBD_CMD_FLAG_FAST_ZERO   (1u << 4)
#define NBD_CMD_FLAG_PAYLOAD_LEN (1u << 5)

/* Structured reply flags and chunk types (§Structured reply types). */
#define NBD_REPLY_FLAG_DONE               (1u << 0)
#define NBD_REPLY_TYPE_NONE               0
#define NBD_REPLY_TYPE_OFFSET_DATA        1
#define NBD_REPLY_TYPE_OFFSET_HOLE        2
#define NBD_REPLY_TYPE_BLOCK_STATUS       5
#define NBD_REPLY_TYPE_BLOCK_STATUS_EXT   6
#define NBD_REPLY_TYPE_ERROR_BIT          (1u << 15)
#define NBD_REPLY_TYPE_ERROR              (NBD_REPLY_TYPE_ERROR_BIT | 1)
#define NBD_REPLY_TYPE_ERROR_OFFSET       (NBD_REPLY_TYPE_ERROR_BIT | 2)

/* Error values on the wire (§Error values). Never a raw host errno. */
#define NBD_EPERM     1
#define NBD_EIO       5
#define NBD_ENOMEM    12
#define NBD_EINVAL    22
#define NBD_ENOSPC    28
#define NBD_EOVERFLOW 75
#define NBD_ENOTSUP   95
#define NBD_ESHUTDOWN 108

/* base:allocation (§base:allocation metadata context). */
#define NBD_STATE_HOLE 1u
#define NBD_STATE_ZERO 2u
#define NBD_META_BASE_ALLOCATION "base:allocation"

/* Sizes of fixed wire structures. */
#define NBD_GREETING_LEN         18  /* NBDMAGIC, IHAVEOPT, u16 flags */
#define NBD_OLDSTYLE_LEN         152
#define NBD_OPT_HDR_LEN          16
#define NBD_OPT_REPLY_HDR_LEN    20
#define NBD_EXPORT_NAME_REPLY_LEN 10 /* + 124 zeroes unless NO_ZEROES */
#define NBD_ZEROES_LEN           124
#define NBD_REQUEST_LEN          28
#define NBD_EXTENDED_REQUEST_LEN 32
#define NBD_SIMPLE_REPLY_LEN     16
#define NBD_STRUCTURED_REPLY_LEN 20
#define NBD_EXTENDED_REPLY_LEN   32

/* Limits (§Conventions, §Size constraints). */
#define NBD_MAX_STRING      4096        /* names, messages: MUST be <= */
#define NBD_MAX_PAYLOAD_DEFAULT (32u << 20) /* accepted without advertising */

#endif
