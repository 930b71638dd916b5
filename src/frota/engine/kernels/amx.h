// What the AMX kernels share: the tile configuration. Include it inside a region compiled for
// the tile instructions (#pragma GCC target("amx-tile,...")); amx_available() (kernels.h) says
// whether the CPU and OS give the tiles.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace frota_amx {

constexpr int64_t kTileWords = 16 * 32;  // bfloat16 per tile: 16 rows of 64 bytes

// The operand of ldtilecfg: palette 1, then each of the 8 tiles' bytes per row and rows.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads `config` into the tile unit. GCC's _tile_loadconfig tells the compiler that it reads
// only the first 8 bytes of the configuration, which lets it move the other stores past the
// instruction; the barrier keeps them before it.
inline void load_config(const TileConfig& config) {
  asm volatile("" ::: "memory");
  _tile_loadconfig(&config);
}

// Every tile 16 rows of 64 bytes: 16 x 16 float32 accumulators, or 16 x 32 bfloat16 operands.
inline void configure_full_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  load_config(config);
}

}  // namespace frota_amx
