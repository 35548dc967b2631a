/* rn/crc32c.h: CRC32C (Castagnoli polynomial, as in iSCSI, ext4 and LevelDB). */
#ifndef RN_CRC32C_H
#define RN_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of len bytes, continuing from crc (pass 0 to start). */
uint32_t rn_crc32c(uint32_t crc, const void *data, size_t len);

#endif
