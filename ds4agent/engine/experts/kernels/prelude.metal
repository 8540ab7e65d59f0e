// Metal's spelling of what blocks.h needs (see the comment at its top).
#define DS4_FN inline
#define DS4_GLOBAL device
#define DS4_PRIVATE thread

inline float ds4_half_bits(uint32_t bits) {
    return float(as_type<half>(ushort(bits)));
}
