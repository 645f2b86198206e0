/* Redis 7.2's d2string (src/util.c): a double as Redis 7.2 replies it.
 *
 * nan and inf spelled out, 0 as "0" or "-0", an integral value within
 * +-(LLONG_MAX / 2) as an integer (double2ll), any other through fpconv_dtoa
 * (Grisu2: the shortest digits in almost every case, always read back
 * exactly), e.g. 49.9, 0.1, 1e-07 written "1e-7", 1.5e+300.  `buf` holds
 * at least 32 bytes; returns the length written (no NUL). */
#ifndef RANKD_DOUBLES_H
#define RANKD_DOUBLES_H

#include <limits.h>
#include <math.h>
#include <string.h>

#include "fpconv/fpconv_dtoa.c"

static inline int rankd_d2string(char *buf, double value) {
    /* The common case first: an integral score within double2ll's range
     * (NaN and the infinities fail the comparisons; -0 is written "-0"). */
    if (value >= (double)(-LLONG_MAX / 2) && value <= (double)(LLONG_MAX / 2)) {
        long long integral = (long long)value;
        if ((double)integral == value && !(integral == 0 && signbit(value))) {
            char reversed[24];
            unsigned long long magnitude = integral < 0 ? 0ULL - (unsigned long long)integral
                                                        : (unsigned long long)integral;
            int n = 0, size = 0;
            do {
                reversed[n++] = (char)('0' + magnitude % 10);
                magnitude /= 10;
            } while (magnitude);
            if (integral < 0)
                buf[size++] = '-';
            while (n)
                buf[size++] = reversed[--n];
            return size;
        }
    }
    if (isnan(value)) {
        memcpy(buf, "nan", 3);
        return 3;
    }
    if (isinf(value)) {
        if (value < 0) {
            memcpy(buf, "-inf", 4);
            return 4;
        }
        memcpy(buf, "inf", 3);
        return 3;
    }
    if (value == 0) {  /* -0 */
        memcpy(buf, "-0", 2);
        return 2;
    }
    return fpconv_dtoa(value, buf);
}

#endif
