/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the WAL frames'
 * checksum since format 2 (see rankd/engine/frames.py).
 *
 * Two implementations giving the same results: the SSE4.2 ``crc32``
 * instruction, used when the CPU has it (checked once, at run time: the
 * extension is built for any x86-64), and a portable slicing-by-8 table
 * walk everywhere else.  ``rankd_crc32c`` picks one; the other stays
 * callable so the tests can compare them.  ``crc`` is the CRC of the bytes
 * before (0 to start), as zlib's crc32 takes it.
 */
#ifndef RANKD_CRC32C_H
#define RANKD_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The WAL frame length word's bit saying the frame carries CRC-32C. */
#define RANKD_WAL_CRC32C_FLAG 0x80000000u

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RANKD_CRC32C_X86 1
#include <nmmintrin.h>
#endif

static uint32_t rankd_crc32c_table[8][256];
static int rankd_crc32c_ready = 0;   /* tables built, hardware checked */
static int rankd_crc32c_hw = 0;

static void rankd_crc32c_init(void) {
    uint32_t i, j, crc;
    if (rankd_crc32c_ready)
        return;
    for (i = 0; i < 256; i++) {
        crc = i;
        for (j = 0; j < 8; j++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
        rankd_crc32c_table[0][i] = crc;
    }
    for (i = 0; i < 256; i++) {
        crc = rankd_crc32c_table[0][i];
        for (j = 1; j < 8; j++) {
            crc = rankd_crc32c_table[0][crc & 0xff] ^ (crc >> 8);
            rankd_crc32c_table[j][i] = crc;
        }
    }
#ifdef RANKD_CRC32C_X86
    __builtin_cpu_init();
    rankd_crc32c_hw = __builtin_cpu_supports("sse4.2");
#endif
    rankd_crc32c_ready = 1;
}

/* Portable: eight bytes a step through eight tables (little-endian loads,
 * like the rest of the WAL code). */
static uint32_t rankd_crc32c_portable(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t word;
    crc = ~crc;
    while (n >= 8) {
        memcpy(&word, p, 8);
        word ^= crc;
        crc = rankd_crc32c_table[7][word & 0xff] ^ rankd_crc32c_table[6][(word >> 8) & 0xff]
            ^ rankd_crc32c_table[5][(word >> 16) & 0xff] ^ rankd_crc32c_table[4][(word >> 24) & 0xff]
            ^ rankd_crc32c_table[3][(word >> 32) & 0xff] ^ rankd_crc32c_table[2][(word >> 40) & 0xff]
            ^ rankd_crc32c_table[1][(word >> 48) & 0xff] ^ rankd_crc32c_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = rankd_crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#ifdef RANKD_CRC32C_X86
__attribute__((target("sse4.2")))
static uint32_t rankd_crc32c_hardware(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = ~crc, word;
    while (n >= 8) {
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#else
static uint32_t rankd_crc32c_hardware(uint32_t crc, const unsigned char *p, size_t n) {
    return rankd_crc32c_portable(crc, p, n);
}
#endif

static inline uint32_t rankd_crc32c(uint32_t crc, const unsigned char *p, size_t n) {
    if (rankd_crc32c_hw)
        return rankd_crc32c_hardware(crc, p, n);
    return rankd_crc32c_portable(crc, p, n);
}

#endif
