//! A draw-for-draw reimplementation of numpy's `np.random.default_rng(seed)`.
//!
//! The Zeus batch-size optimizer decides which batch size to try next with Thompson
//! sampling: every decision draws a random permutation of the arms
//! (`rng.choice(arms, len(arms), replace=False)`) and, once exploration is over, one
//! Gaussian sample per arm (`rng.normal(mean, scale)`). The reference implementation
//! does this with numpy, and the optimizer server stores the generator between
//! decisions as `json.dumps(rng.bit_generator.state)`. A Rust port can only make the
//! same decisions as the reference if it consumes the same random stream in the same
//! way, and it can only pick up jobs that the Python server started if it reads the
//! stored state. [`NumpyRng`] provides exactly that subset of numpy's `Generator`:
//!
//! * seeding: `default_rng(seed)` is `PCG64(SeedSequence(seed))`, reproduced by
//!   [`NumpyRng::from_seed`] and [`NumpyRng::from_seed_words`];
//! * the raw PCG64 stream, including numpy's buffering of the upper half of a 64-bit
//!   draw for the next 32-bit draw ([`NumpyRng::next_u64`], [`NumpyRng::next_u32`],
//!   [`NumpyRng::next_double`]);
//! * bounded integers ([`NumpyRng::bounded`]) and sampling without replacement
//!   ([`NumpyRng::choice`], [`NumpyRng::choice_all`]);
//! * Gaussian samples from numpy's 256-layer ziggurat ([`NumpyRng::standard_normal`],
//!   [`NumpyRng::normal`]);
//! * the state as numpy's `bit_generator.state` holds it ([`NumpyRng::state`],
//!   [`NumpyRng::from_state`]; its JSON is written and read in Python, whose integers
//!   keep 128 bits).
//!
//! Seeding, the raw stream, bounded integers and `choice` are integer arithmetic (and
//! `next_double` one exact scaling), so they match numpy bit for bit everywhere. The
//! ziggurat involves the platform's `exp`, `ln` and `ln_1p` in two places:
//!
//! * Its tables are computed on first use (see `ZigguratTables::build`). With glibc,
//!   whose `exp` and `log` are correctly rounded for every argument involved, they
//!   equal numpy's tables exactly; a test compares them, so a platform whose math
//!   library rounds one of these values differently is caught there.
//! * Sampling calls `exp` in the wedge test and `log1p` in the tail, as numpy's C code
//!   does with the same math library. These only decide the rare wedge and tail cases,
//!   and only a value within one rounding error of the decision boundary could differ.
//!
//! The tests check every part against values numpy produced, including 100,000 normal
//! samples per seed bit for bit.

use std::collections::HashSet;
use std::sync::OnceLock;

/// Up to this many picks, `choice` looks for repeats by scanning its picks.
const SMALL_CHOICE: usize = 32;

/// The PCG64 (XSL-RR 128/64) LCG multiplier that numpy uses.
const PCG_MULTIPLIER: u128 = 0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645;

/// Number of 32-bit words in `SeedSequence`'s entropy pool (numpy's default pool size).
const POOL_SIZE: usize = 4;
/// Initial value of the multiplier used when hashing entropy into the pool.
const INIT_A: u32 = 0x43b0_d7e5;
/// Step applied to that multiplier after every hash.
const MULT_A: u32 = 0x931e_8875;
/// Initial value of the multiplier used when drawing output words from the pool.
const INIT_B: u32 = 0x8b51_f9dd;
/// Step applied to that multiplier after every output word.
const MULT_B: u32 = 0x58f3_8ded;
/// Left factor when combining two pool words.
const MIX_MULT_L: u32 = 0xca01_f9dd;
/// Right factor when combining two pool words.
const MIX_MULT_R: u32 = 0x4973_f715;
/// Shift of the xorshift that ends every hash and mix step (half the word width).
const XSHIFT: u32 = 16;

/// A numpy `Generator` over `PCG64`, reproducing numpy's draws exactly.
///
/// The fields are numpy's `bit_generator.state`: the 128-bit LCG state and increment,
/// and the 32-bit buffer (`has_uint32`, `uinteger`) that holds the upper half of a
/// 64-bit draw after a 32-bit draw has used its lower half.
///
/// # Examples
///
/// ```ignore
/// // Python: rng = np.random.default_rng(42)
/// let mut rng = NumpyRng::from_seed(42);
/// // Python: order = rng.choice(np.array(arms), len(arms), replace=False)
/// let order: Vec<u32> = rng.choice_all(arms.len()).into_iter().map(|i| arms[i]).collect();
/// // Python: sample = rng.normal(mean, scale)
/// let sample = rng.normal(mean, scale);
/// // Python: rng.bit_generator.state
/// let stored = rng.state();
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumpyRng {
    state: u128,
    inc: u128,
    has_uint32: bool,
    uinteger: u32,
}

impl NumpyRng {
    /// The generator `np.random.default_rng(seed)` returns.
    ///
    /// numpy splits the integer seed into 32-bit words, least significant first, so a
    /// seed below 2^32 is one word and any other `u64` is two; see
    /// [`NumpyRng::from_seed_words`] for larger Python integers.
    pub fn from_seed(seed: u64) -> Self {
        // Truncations are intended: the seed is split into its two 32-bit halves.
        let low = seed as u32;
        let high = (seed >> 32) as u32;
        if high == 0 {
            Self::from_seed_words(&[low])
        } else {
            Self::from_seed_words(&[low, high])
        }
    }

    /// The generator `np.random.default_rng(entropy)` returns, given the entropy as
    /// numpy sees it: 32-bit words, least significant first.
    ///
    /// For a non-negative Python integer `n`, the words are `n & 0xffffffff`,
    /// `(n >> 32) & 0xffffffff`, ... up to the highest non-zero word (`[0]` for 0); this
    /// is how numpy's `SeedSequence` coerces integer entropy. Words beyond the pool's
    /// four are folded into the pool as numpy does, so seeds of any size work. As in
    /// numpy, missing words among the first four count as zeros, so `[7]` and `[7, 0]`
    /// give the same generator.
    pub fn from_seed_words(words: &[u32]) -> Self {
        let seed = seed_sequence_u64x4(words);
        // numpy passes the first two words as (high, low) of the initial state and the
        // next two as (high, low) of the stream selector.
        let init_state = (u128::from(seed[0]) << 64) | u128::from(seed[1]);
        let init_seq = (u128::from(seed[2]) << 64) | u128::from(seed[3]);
        // PCG's `srandom`: start from zero on the selected stream, step, add the seed
        // state, step again.
        let mut rng = NumpyRng {
            state: 0,
            inc: (init_seq << 1) | 1,
            has_uint32: false,
            uinteger: 0,
        };
        rng.step();
        rng.state = rng.state.wrapping_add(init_state);
        rng.step();
        rng
    }

    /// Advances the 128-bit LCG by one step.
    fn step(&mut self) {
        self.state = self
            .state
            .wrapping_mul(PCG_MULTIPLIER)
            .wrapping_add(self.inc);
    }

    /// The next 64-bit output (numpy's `bit_generator.random_raw()`).
    ///
    /// PCG64 steps the LCG, then outputs the XOR of the state's two halves rotated
    /// right by the state's top six bits (XSL-RR). This does not touch the 32-bit
    /// buffer, as in numpy.
    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let state = self.state;
        // Truncations are intended: XSL folds the two 64-bit halves together.
        let folded = ((state >> 64) as u64) ^ (state as u64);
        folded.rotate_right((state >> 122) as u32)
    }

    /// The next 32-bit output, with numpy's buffering.
    ///
    /// When the buffer is empty this draws 64 bits, returns the lower 32 and keeps the
    /// upper 32, which the following call returns without drawing.
    pub fn next_u32(&mut self) -> u32 {
        if self.has_uint32 {
            self.has_uint32 = false;
            return self.uinteger;
        }
        let next = self.next_u64();
        self.has_uint32 = true;
        self.uinteger = (next >> 32) as u32;
        // Truncation is intended: the lower half is returned now.
        next as u32
    }

    /// A uniform double in [0, 1) with 53 random bits (numpy's `rng.random()`).
    pub fn next_double(&mut self) -> f64 {
        // Both conversions are exact: the integer has 53 bits, the scale is 2^-53.
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// A uniform integer in `0..=max_inclusive`, drawn as numpy's bounded integers are.
    ///
    /// This is `rng.integers(0, max_inclusive + 1)` (or, for any `u64` bound,
    /// `rng.integers(0, max_inclusive, endpoint=True, dtype=np.uint64)`), and the draw
    /// numpy's `choice` and shuffles make for each index. A bound of 0 consumes nothing.
    /// Bounds below 2^32 - 1 use Lemire's multiply-and-reject method on buffered 32-bit
    /// draws ([`NumpyRng::next_u32`]); 2^32 - 1 returns one 32-bit draw; larger bounds
    /// use Lemire's method on 64-bit draws, and `u64::MAX` returns one 64-bit draw.
    pub fn bounded(&mut self, max_inclusive: u64) -> u64 {
        const U32_MAX: u64 = u32::MAX as u64;
        match max_inclusive {
            0 => 0,
            // The guard makes the truncation lossless.
            m if m < U32_MAX => u64::from(self.lemire_u32(m as u32)),
            U32_MAX => u64::from(self.next_u32()),
            u64::MAX => self.next_u64(),
            m => self.lemire_u64(m),
        }
    }

    /// Lemire's nearly divisionless method for `0..=max` with 32-bit draws.
    ///
    /// `max` must be below `u32::MAX`, so the range size does not overflow.
    fn lemire_u32(&mut self, max: u32) -> u32 {
        let range = max + 1;
        let mut product = u64::from(self.next_u32()) * u64::from(range);
        // Truncation is intended: the low word decides whether to reject.
        let mut leftover = product as u32;
        if leftover < range {
            // 2^32 mod range: products whose low word falls below it are rejected.
            let threshold = (u32::MAX - max) % range;
            while leftover < threshold {
                product = u64::from(self.next_u32()) * u64::from(range);
                leftover = product as u32;
            }
        }
        (product >> 32) as u32
    }

    /// Lemire's nearly divisionless method for `0..=max` with 64-bit draws.
    ///
    /// `max` must be below `u64::MAX`, so the range size does not overflow.
    fn lemire_u64(&mut self, max: u64) -> u64 {
        let range = max + 1;
        let mut product = u128::from(self.next_u64()) * u128::from(range);
        // Truncation is intended: the low word decides whether to reject.
        let mut leftover = product as u64;
        if leftover < range {
            // 2^64 mod range: products whose low word falls below it are rejected.
            let threshold = (u64::MAX - max) % range;
            while leftover < threshold {
                product = u128::from(self.next_u64()) * u128::from(range);
                leftover = product as u64;
            }
        }
        (product >> 64) as u64
    }

    /// Swaps `data[i]` with a uniform `data[j]`, `j` in `0..=i`, for `i` from the last
    /// index down to `first`: numpy's integer shuffle, which `choice` uses.
    fn shuffle_down_to<T>(&mut self, data: &mut [T], first: usize) {
        for i in (first..data.len()).rev() {
            // `j <= i`, so it fits `usize`.
            let j = self.bounded(i as u64) as usize;
            data.swap(i, j);
        }
    }

    /// The indices `rng.choice(population, size, replace=False)` returns (with numpy's
    /// defaults `p=None`, `shuffle=True`), in the same order.
    ///
    /// `rng.choice(arr, size, replace=False)` returns `arr[indices]` for these indices.
    /// numpy picks one of two algorithms, and this follows the same rule:
    ///
    /// * if `population > 10_000` and `size > population / 50` (integer division), a
    ///   partial Fisher-Yates shuffle of `0..population` from the end down to
    ///   `max(population - size, 1)`, returning the last `size` entries;
    /// * otherwise, including every population a bandit has, Floyd's algorithm (one
    ///   bounded draw in `0..=j` for each `j` from `population - size` to
    ///   `population - 1`, taking `j` itself when the draw was already chosen),
    ///   followed by a shuffle of the `size` chosen indices down to index 1.
    ///
    /// # Panics
    ///
    /// If `size > population` (numpy raises `ValueError`).
    pub fn choice(&mut self, population: usize, size: usize) -> Vec<usize> {
        assert!(
            size <= population,
            "cannot choose {size} of {population} items without replacement"
        );
        if population > 10_000 && size > population / 50 {
            let mut indices: Vec<usize> = (0..population).collect();
            self.shuffle_down_to(&mut indices, (population - size).max(1));
            indices.drain(..population - size);
            return indices;
        }
        // A bandit's handful of arms is searched faster by a scan than through a hash set.
        let mut chosen = (size > SMALL_CHOICE).then(|| HashSet::with_capacity(size));
        let mut indices = Vec::with_capacity(size);
        for j in population - size..population {
            // The draw is at most `j`, so it fits `usize`.
            let drawn = self.bounded(j as u64) as usize;
            let taken = match &chosen {
                Some(set) => set.contains(&drawn),
                None => indices.contains(&drawn),
            };
            // Every earlier pick is below `j`, so `j` itself is always new.
            let pick = if taken { j } else { drawn };
            if let Some(set) = chosen.as_mut() {
                set.insert(pick);
            }
            indices.push(pick);
        }
        self.shuffle_down_to(&mut indices, 1);
        indices
    }

    /// A random permutation of `0..n`, as `rng.choice(arr, n, replace=False)` orders an
    /// array `arr` of length `n`; shorthand for [`NumpyRng::choice`]`(n, n)`.
    ///
    /// This is the draw the Thompson-sampling bandit makes on every decision.
    pub fn choice_all(&mut self, n: usize) -> Vec<usize> {
        self.choice(n, n)
    }

    /// A standard normal sample from numpy's 256-layer ziggurat
    /// (`rng.standard_normal()`).
    ///
    /// Each attempt draws 64 bits: the low 8 choose the layer, the next bit the sign,
    /// and the next 52 the magnitude within the layer. About 99% of attempts land in
    /// the layer's inner rectangle and return at once. Otherwise, the base layer samples
    /// the tail beyond `r` with Marsaglia's exponential method (two uniform doubles per
    /// try, the sign taken from bit 8 of the magnitude), and the other layers accept
    /// the point under the density curve with one more uniform double, or start over.
    pub fn standard_normal(&mut self) -> f64 {
        let tables = ZigguratTables::get();
        loop {
            let bits = self.next_u64();
            // The mask makes the truncation lossless.
            let layer = (bits & 0xff) as usize;
            let bits = bits >> 8;
            let negative = bits & 1 == 1;
            let magnitude = (bits >> 1) & 0x000f_ffff_ffff_ffff;
            // Exact: the magnitude has 52 bits.
            let mut x = magnitude as f64 * tables.wi[layer];
            if negative {
                x = -x;
            }
            if magnitude < tables.ki[layer] {
                return x;
            }
            if layer == 0 {
                loop {
                    // `1 - u` rather than `u`, so the logarithm never sees zero.
                    let xx = -ZIGGURAT_INV_R * (-self.next_double()).ln_1p();
                    let yy = -(-self.next_double()).ln_1p();
                    if yy + yy > xx * xx {
                        return if (magnitude >> 8) & 1 == 1 {
                            -(ZIGGURAT_R + xx)
                        } else {
                            ZIGGURAT_R + xx
                        };
                    }
                }
            }
            let height =
                (tables.fi[layer - 1] - tables.fi[layer]) * self.next_double() + tables.fi[layer];
            if height < (-0.5 * x * x).exp() {
                return x;
            }
        }
    }

    /// A normal sample with mean `loc` and standard deviation `scale`
    /// (`rng.normal(loc, scale)`): `loc + scale * z` for one standard normal `z`.
    ///
    /// A zero `scale` still consumes a sample and returns `loc`, as in numpy. numpy
    /// rejects a negative `scale` with `ValueError`; this does not check it.
    pub fn normal(&mut self, loc: f64, scale: f64) -> f64 {
        loc + scale * self.standard_normal()
    }

    /// numpy's `bit_generator.state` of this generator.
    pub fn state(&self) -> Pcg64State {
        Pcg64State {
            state: self.state,
            inc: self.inc,
            has_uint32: self.has_uint32,
            uinteger: self.uinteger,
        }
    }

    /// The generator in the state numpy's `bit_generator.state` describes (numpy's `PCG64`
    /// takes any 128-bit state and increment as they are).
    pub fn from_state(s: Pcg64State) -> Self {
        NumpyRng {
            state: s.state,
            inc: s.inc,
            has_uint32: s.has_uint32,
            uinteger: s.uinteger,
        }
    }
}

/// numpy's `PCG64.state`: the 128-bit LCG state and increment, and the buffered upper half of
/// a 64-bit draw a 32-bit draw left (`has_uint32`, `uinteger`). The batch-size optimizer
/// server stores it as numpy's JSON (`zeus.optimizer.batch_size.server.logic`), which Python's
/// `json` reads with its integers whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pcg64State {
    pub state: u128,
    pub inc: u128,
    pub has_uint32: bool,
    pub uinteger: u32,
}

/// numpy's `SeedSequence(entropy).generate_state(4, np.uint64)`.
///
/// The entropy words are hashed into a four-word pool, every pool word is mixed into
/// every other, words beyond the fourth are mixed into all four, and eight output words
/// are hashed out of the pool (cycling through it) and paired little-endian into four
/// 64-bit words.
fn seed_sequence_u64x4(entropy: &[u32]) -> [u64; 4] {
    let mut hasher = EntropyHasher { multiplier: INIT_A };
    let mut pool = [0u32; POOL_SIZE];
    for (i, slot) in pool.iter_mut().enumerate() {
        *slot = hasher.hash(entropy.get(i).copied().unwrap_or(0));
    }
    for src in 0..POOL_SIZE {
        for dst in 0..POOL_SIZE {
            if src != dst {
                let hashed = hasher.hash(pool[src]);
                pool[dst] = mix(pool[dst], hashed);
            }
        }
    }
    for &word in entropy.iter().skip(POOL_SIZE) {
        for slot in pool.iter_mut() {
            let hashed = hasher.hash(word);
            *slot = mix(*slot, hashed);
        }
    }
    let mut multiplier = INIT_B;
    let mut out = [0u64; 4];
    for i in 0..2 * out.len() {
        let mut word = pool[i % POOL_SIZE] ^ multiplier;
        multiplier = multiplier.wrapping_mul(MULT_B);
        word = word.wrapping_mul(multiplier);
        word ^= word >> XSHIFT;
        out[i / 2] |= u64::from(word) << (32 * (i % 2));
    }
    out
}

/// `SeedSequence`'s input hash, whose multiplier advances with every word it hashes.
struct EntropyHasher {
    multiplier: u32,
}

impl EntropyHasher {
    fn hash(&mut self, value: u32) -> u32 {
        let mut value = value ^ self.multiplier;
        self.multiplier = self.multiplier.wrapping_mul(MULT_A);
        value = value.wrapping_mul(self.multiplier);
        value ^ (value >> XSHIFT)
    }
}

/// `SeedSequence`'s combination of a pool word `x` with a hashed word `y`.
fn mix(x: u32, y: u32) -> u32 {
    let result = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    result ^ (result >> XSHIFT)
}

/// Where the tail begins: the right edge of the ziggurat's base layer
/// (numpy's 3.6541528853610087963519472518, rounded to the nearest double).
const ZIGGURAT_R: f64 = 3.654_152_885_361_009;
/// `1 / ZIGGURAT_R`, which is also the double nearest numpy's constant
/// 0.27366123732975827203338247596 (checked by a test).
const ZIGGURAT_INV_R: f64 = 1.0 / ZIGGURAT_R;
/// The area of every layer (rectangle plus wedge; for the base layer, rectangle plus
/// tail) under the unnormalized density `exp(-x^2 / 2)`.
///
/// This is the double that numpy's tables were built with: mathematically the area is
/// `r f(r) + sqrt(pi / 2) erfc(r / sqrt(2))` = 0.0049286732339746545..., and numpy's
/// value is three units in the last place below that, as its `wi[0]` (which is
/// `area / f(r) / 2^52`) shows. Using the exact value would move every table entry by a
/// few units in the last place.
const ZIGGURAT_AREA: f64 = 0.004_928_673_233_974_652;
/// Number of layers.
const ZIGGURAT_LAYERS: usize = 256;
/// 2^52: magnitudes are 52-bit integers scaled by `wi`.
const TWO_POW_52: f64 = 4_503_599_627_370_496.0;
/// The layer whose density value numpy's table holds one unit in the last place above
/// the correctly rounded `exp(-x^2 / 2)`; see [`ZigguratTables::build`].
const NUMPY_ROUNDED_UP_LAYER: usize = 38;

/// The ziggurat tables of numpy's `random_standard_normal`, computed on first use.
///
/// Layer `i` (1 <= i <= 255) spans heights `fi[i]..fi[i - 1]` of the density
/// `f(x) = exp(-x^2 / 2)` and extends to `x_i = wi[i] * 2^52`, with `x_255 = r` and the
/// `x_i` shrinking towards the top; layer 0 is the base, a rectangle of width
/// `area / f(r)` plus the tail. A 52-bit magnitude `m` lies in the layer's inner
/// rectangle, which needs no further test, when `m < ki[i] = x_{i-1} / x_i * 2^52`.
struct ZigguratTables {
    ki: [u64; ZIGGURAT_LAYERS],
    wi: [f64; ZIGGURAT_LAYERS],
    fi: [f64; ZIGGURAT_LAYERS],
}

impl ZigguratTables {
    fn get() -> &'static ZigguratTables {
        static TABLES: OnceLock<ZigguratTables> = OnceLock::new();
        TABLES.get_or_init(ZigguratTables::build)
    }

    /// Builds the tables with Marsaglia and Tsang's recurrence in double precision,
    /// exactly as numpy's were built.
    ///
    /// Going up from `x_255 = r`, each `x_i` solves `x_{i+1} (f(x_i) - f(x_{i+1})) =
    /// area`, i.e. `x_i = sqrt(-2 ln(area / x_{i+1} + f(x_{i+1})))`, and `ki` is the
    /// ratio of consecutive `x` scaled by 2^52, rounded to nearest with ties to even.
    ///
    /// numpy's tables are fixed data, produced once by a math library whose `exp`
    /// rounded `f(x_38)` one unit in the last place up; `x_37` through `x_1` (and their
    /// `ki` and `fi`) inherit that through the recurrence. With the correctly rounded
    /// value, about a seventh of all draws (layers 1 to 37) would come out a few units
    /// in the last place away from numpy's, so this applies the same rounding.
    fn build() -> ZigguratTables {
        let density = |x: f64| (-0.5 * x * x).exp();
        let mut ki = [0u64; ZIGGURAT_LAYERS];
        let mut wi = [0.0f64; ZIGGURAT_LAYERS];
        let mut fi = [0.0f64; ZIGGURAT_LAYERS];
        let top = ZIGGURAT_LAYERS - 1;
        let base_width = ZIGGURAT_AREA / density(ZIGGURAT_R);
        ki[0] = ratio_to_threshold(ZIGGURAT_R / base_width);
        wi[0] = base_width / TWO_POW_52;
        fi[0] = 1.0;
        wi[top] = ZIGGURAT_R / TWO_POW_52;
        fi[top] = density(ZIGGURAT_R);
        // The topmost layer has no inner rectangle: every point takes the wedge test.
        ki[1] = 0;
        let mut outer = ZIGGURAT_R;
        for i in (1..top).rev() {
            let x = (-2.0 * (ZIGGURAT_AREA / outer + fi[i + 1]).ln()).sqrt();
            ki[i + 1] = ratio_to_threshold(x / outer);
            wi[i] = x / TWO_POW_52;
            fi[i] = density(x);
            if i == NUMPY_ROUNDED_UP_LAYER {
                fi[i] = f64::from_bits(fi[i].to_bits() + 1);
            }
            outer = x;
        }
        ZigguratTables { ki, wi, fi }
    }
}

/// `ratio * 2^52` rounded to the nearest integer, ties to even (`ratio` in (0, 1)).
fn ratio_to_threshold(ratio: f64) -> u64 {
    // Lossless: the rounded value is a non-negative integer below 2^52.
    (ratio * TWO_POW_52).round_ties_even() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use numpy::*;

    // Expected values come from numpy 2.4.6 (`default_rng`, PCG64). This script printed
    // the body of `mod numpy` below:
    //
    // import json, numpy as np
    //
    // SEEDS = [0, 1, 42, 123456, 2**40 + 7]
    // HIGHS = [1, 2, 3, 10, 1000, 2**31 + 5, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 3, 2**62 + 9, 2**63 - 1]
    //
    // def fnv(values):
    //     h = 0xcbf29ce484222325
    //     for v in values:
    //         h = ((h ^ int(v)) * 0x100000001b3) % 2**64
    //     return h
    //
    // def bits(x):
    //     return int(np.float64(x).view(np.uint64))
    //
    // def u32(rng):
    //     bg = rng.bit_generator
    //     return int(bg.ctypes.next_uint32(bg.ctypes.state))
    //
    // def state(rng):
    //     return 'r#"' + json.dumps(rng.bit_generator.state) + '"#'
    //
    // def hx(xs):
    //     return "[" + ", ".join(f"{x:#x}" for x in xs) + "]"
    //
    // print("pub const SEEDED: &[(u64, &str)] = &[")
    // for s in SEEDS + [2**64 - 1]:
    //     print(f"    ({s}, {state(np.random.default_rng(s))}),")
    // print("];")
    // print("pub const SEEDED_WORDS: &[(&[u32], &str)] = &[")
    // for s in [2**70 + 3, 2**140 + 12345]:
    //     words = [(s >> (32 * k)) & 0xFFFFFFFF for k in range((s.bit_length() + 31) // 32)]
    //     print(f"    (&{words}, {state(np.random.default_rng(s))}),")
    // print("];")
    // print("pub const RAW: &[Raw] = &[")
    // for s in SEEDS:
    //     rng = np.random.default_rng(s)
    //     first = [int(rng.bit_generator.random_raw()) for _ in range(4)]
    //     rng = np.random.default_rng(s)
    //     mixed = [u32(rng) for _ in range(7)] + [int(rng.bit_generator.random_raw()) for _ in range(3)]
    //     mixed += [u32(rng) for _ in range(2)] + [bits(rng.random()) for _ in range(3)]
    //     print(f"    Raw {{ seed: {s}, u64s: {hx(first)}, mixed: {hx(mixed)} }},")
    // print("];")
    // print("pub const BOUNDED: &[(u64, [u64; 12], &str)] = &[")
    // for s in SEEDS:
    //     rng = np.random.default_rng(s)
    //     u32(rng)
    //     print(f"    ({s}, {[int(rng.integers(0, hi)) for hi in HIGHS]}, {state(rng)}),")
    // print("];")
    // print("pub const BANDIT: &[Bandit] = &[")
    // for s in SEEDS:
    //     rng = np.random.default_rng(s)
    //     perms, best, drawn = [], [], []
    //     for n in range(1, 13):
    //         arms = [8 * (i + 1) for i in range(n)]
    //         order = rng.choice(np.array(arms), len(arms), replace=False)
    //         perms.append([int(a) // 8 - 1 for a in order])
    //         samples = []
    //         for i, a in enumerate(arms):
    //             scale = 0.0 if a % 24 == 0 else 1.0 + a / 64
    //             samples.append(float(rng.normal(10.0 + 0.25 * (i % 5), scale)))
    //         drawn += [bits(x) for x in samples]
    //         best.append(max(range(n), key=samples.__getitem__))
    //     perms = ", ".join(f"&{p}" for p in perms)
    //     print(f"    Bandit {{ seed: {s}, perms: &[{perms}], best: {best}, fnv: {fnv(drawn):#x}, state: {state(rng)} }},")
    // print("];")
    // print("pub const NORMALS: &[Normals] = &[")
    // for s in SEEDS:
    //     rng = np.random.default_rng(s)
    //     z = rng.standard_normal(100_000)
    //     tail = int((abs(z) > 3.6541528853610088).sum())
    //     print(f"    Normals {{ seed: {s}, first: {hx(bits(x) for x in z[:6])}, at_9999: {bits(z[9999]):#x}, "
    //           f"fnv: {fnv(z.view(np.uint64)):#x}, tail: {tail}, state: {state(rng)} }},")
    // print("];")
    // print("pub const CHOICES_SEED_7: &[(usize, usize, &[usize], u64, &str)] = &[")
    // rng = np.random.default_rng(7)
    // for pop, size in [(5, 1), (1000, 1), (10001, 10001), (10001, 200), (20000, 401), (2**33, 3)]:
    //     c = [int(x) for x in rng.choice(pop, size, replace=False)]
    //     print(f"    ({pop}, {size}, &{c[:5]}, {fnv(c):#x}, {state(rng)}),")
    // print("];")
    // rng = np.random.default_rng(99)
    // [u32(rng) for _ in range(3)]
    // rng.standard_normal(5)
    // print(f"pub const RESUME_FROM: &str = {state(rng)};")
    // rest = [u32(rng) for _ in range(3)] + [int(rng.bit_generator.random_raw()) for _ in range(2)]
    // rest += [bits(x) for x in rng.standard_normal(3)]
    // print(f"pub const RESUMED: [u64; 8] = {hx(rest)};")
    // print(f"pub const RESUMED_STATE: &str = {state(rng)};")

    /// One seed's raw streams: four `random_raw()` values from a fresh generator, then
    /// from another fresh one 7 x `next_uint32`, 3 x `random_raw()`, 2 x `next_uint32` and
    /// the bits of 3 x `random()`.
    struct Raw {
        seed: u64,
        u64s: [u64; 4],
        mixed: [u64; 15],
    }

    /// Twelve bandit decisions, with 1 to 12 arms: each one's choice permutation and the
    /// argmax of its per-arm normal samples, then a digest of all samples' bits and the
    /// final state.
    struct Bandit {
        seed: u64,
        perms: &'static [&'static [usize]],
        best: [usize; 12],
        fnv: u64,
        state: &'static str,
    }

    /// `standard_normal(100_000)`: the first six, the 10,000th, a digest of all, how
    /// many fell in the tail (|x| > r) and the final state.
    struct Normals {
        seed: u64,
        first: [u64; 6],
        at_9999: u64,
        fnv: u64,
        tail: usize,
        state: &'static str,
    }

    const HIGHS: [u64; 12] = [
        1,
        2,
        3,
        10,
        1000,
        (1 << 31) + 5,
        (1 << 32) - 1,
        1 << 32,
        (1 << 32) + 1,
        (1 << 40) + 3,
        (1 << 62) + 9,
        (1 << 63) - 1,
    ];

    /// What numpy drew (printed by the script above; kept as printed).
    #[rustfmt::skip]
    mod numpy {
        use super::{Bandit, Normals, Raw};

        pub const SEEDED: &[(u64, &str)] = &[
            (0, r#"{"bit_generator": "PCG64", "state": {"state": 35399562948360463058890781895381311971, "inc": 87136372517582989555478159403783844777}, "has_uint32": 0, "uinteger": 0}"#),
            (1, r#"{"bit_generator": "PCG64", "state": {"state": 207833532711051698738587646355624148094, "inc": 194290289479364712180083596243593368443}, "has_uint32": 0, "uinteger": 0}"#),
            (42, r#"{"bit_generator": "PCG64", "state": {"state": 274674114334540486603088602300644985544, "inc": 332724090758049132448979897138935081983}, "has_uint32": 0, "uinteger": 0}"#),
            (123456, r#"{"bit_generator": "PCG64", "state": {"state": 170740881631534979674546372191819977557, "inc": 86625949289666656544807559270110712949}, "has_uint32": 0, "uinteger": 0}"#),
            (1099511627783, r#"{"bit_generator": "PCG64", "state": {"state": 332962508046311388156873293427904226163, "inc": 68082541654585819404063318752374113837}, "has_uint32": 0, "uinteger": 0}"#),
            (18446744073709551615, r#"{"bit_generator": "PCG64", "state": {"state": 294777589713777894971777624378622791088, "inc": 73721096341569855656437781216719622637}, "has_uint32": 0, "uinteger": 0}"#),
        ];
        pub const SEEDED_WORDS: &[(&[u32], &str)] = &[
            (&[3, 0, 64], r#"{"bit_generator": "PCG64", "state": {"state": 261677884240599166619758292442913685024, "inc": 83763851724917466588195861024181885465}, "has_uint32": 0, "uinteger": 0}"#),
            (&[12345, 0, 0, 0, 4096], r#"{"bit_generator": "PCG64", "state": {"state": 222193446995285471009590411282031313485, "inc": 106694511945059307765991657960054744635}, "has_uint32": 0, "uinteger": 0}"#),
        ];
        pub const RAW: &[Raw] = &[
            Raw { seed: 0, u64s: [0xa30febcfd9c2825f, 0x4510bdf882d9d721, 0xa7d3da94ecde8b8, 0x43b27b61342f01d], mixed: [0xd9c2825f, 0xa30febcf, 0x82d9d721, 0x4510bdf8, 0x4ecde8b8, 0xa7d3da9, 0x1342f01d, 0xd0327a782cde513b, 0xe9aa5979a6401c4e, 0x9b4c7b7180edb27f, 0x43b27b6, 0xf8829a45, 0x3fe165603cf43b8f, 0x3fedec1d00f1ead7, 0x3fea1b78e9a8e006] },
            Raw { seed: 1, u64s: [0x8306bdf37922e4ff, 0xf35196bbc152a866, 0x24e7a4f608ec18cd, 0xf2dab0aed2ac6fd2], mixed: [0x7922e4ff, 0x8306bdf3, 0xc152a866, 0xf35196bb, 0x8ec18cd, 0x24e7a4f6, 0xd2ac6fd2, 0x4fd42fa03fcd72a9, 0x6c5f1f45de787048, 0xd3e4513345ee6d24, 0xf2dab0ae, 0x41ca3aca, 0x3fe1964580549a3f, 0x3f9c3874c857cc00, 0x3fe81cc785dbb2e6] },
            Raw { seed: 42, u64s: [0xc621fbcd16d92688, 0x705a5661a791ffc1, 0xdbcd12c26eda1624, 0xb286b60e1600888d], mixed: [0x16d92688, 0xc621fbcd, 0xa791ffc1, 0x705a5661, 0x6eda1624, 0xdbcd12c2, 0x1600888d, 0x181c01b5339381eb, 0xf9c262ed86c7538c, 0xc2da0d2fbc5a4471, 0xb286b60e, 0xb7ac9740, 0x3fc066070b41b168, 0x3fdcd31f8a75be6e, 0x3fd7bb27a2e005c4] },
            Raw { seed: 123456, u64s: [0xa2f290ab1932e2c7, 0x6283046bd0d47d21, 0xc2562155fb3c647, 0xf48b718c106e8a68], mixed: [0x1932e2c7, 0xa2f290ab, 0xd0d47d21, 0x6283046b, 0x5fb3c647, 0xc256215, 0x106e8a68, 0xe7f2f4453878667a, 0x74fbf4ed5d7e60a1, 0x47d10ab98e9af082, 0xf48b718c, 0x6710c35f, 0x3fef61fb6242d886, 0x3fe9ff70f20f85c3, 0x3fd3885e381248ba] },
            Raw { seed: 1099511627783, u64s: [0xd46e9e2034de21aa, 0x415badc99c087675, 0x275ed40f045acb84, 0xacac54758134b98b], mixed: [0x34de21aa, 0xd46e9e20, 0x9c087675, 0x415badc9, 0x45acb84, 0x275ed40f, 0x8134b98b, 0xbd24aa55e29bb068, 0x7d7056f11830b8e7, 0x3f12e32ac891a55, 0xacac5475, 0xa5b1662a, 0x3fc11ca13959250c, 0x3fecd6ce8a47d211, 0x3fd5a7cc5cd5f148] },
        ];
        pub const BOUNDED: &[(u64, [u64; 12], &str)] = &[
            (0, [0, 1, 1, 2, 307, 87989972, 323153948, 70985654, 3492969080, 1003585370536, 3364209090780767895, 5014055544817598430], r#"{"bit_generator": "PCG64", "state": {"state": 136626137344985782772388288880891475984, "inc": 87136372517582989555478159403783844777}, "has_uint32": 0, "uinteger": 70985654}"#),
            (1, [0, 1, 2, 9, 34, 309580411, 3534516177, 4074418350, 1339305888, 465452352991, 3817104479337814864, 3774195871892446564], r#"{"bit_generator": "PCG64", "state": {"state": 71741357986094982807612016709125102182, "inc": 194290289479364712180083596243593368443}, "has_uint32": 0, "uinteger": 4074418350}"#),
            (42, [0, 1, 1, 4, 433, 184566854, 2995172877, 865305067, 4190266094, 836881952702, 590819848579757125, 4154077065378586294], r#"{"bit_generator": "PCG64", "state": {"state": 241841658494706541302970550169055938186, "inc": 332724090758049132448979897138935081983}, "has_uint32": 1, "uinteger": 404488629}"#),
            (123456, [0, 1, 2, 3, 373, 101888266, 275679847, 4102779276, 3891459142, 502443339102, 2933718542719398109, 9045459549454211445], r#"{"bit_generator": "PCG64", "state": {"state": 21900301091791218018679188310056286070, "inc": 86625949289666656544807559270110712949}, "has_uint32": 0, "uinteger": 4102779276}"#),
            (1099511627783, [0, 1, 1, 2, 17, 1448487485, 3801854055, 3173296725, 2104514289, 16931238572, 171886791977884042, 1233037665673481277], r#"{"bit_generator": "PCG64", "state": {"state": 33732789465302317688925834792497383876, "inc": 68082541654585819404063318752374113837}, "has_uint32": 0, "uinteger": 3173296725}"#),
        ];
        pub const BANDIT: &[Bandit] = &[
            Bandit { seed: 0, perms: &[&[0], &[1, 0], &[0, 2, 1], &[1, 0, 2, 3], &[2, 4, 3, 1, 0], &[0, 4, 3, 2, 1, 5], &[1, 4, 0, 5, 6, 2, 3], &[2, 5, 4, 1, 3, 6, 0, 7], &[5, 1, 3, 6, 7, 8, 4, 2, 0], &[6, 8, 2, 3, 5, 4, 7, 0, 1, 9], &[3, 8, 10, 2, 7, 4, 5, 0, 6, 9, 1], &[9, 11, 0, 10, 5, 3, 6, 4, 7, 2, 8, 1]], best: [0, 0, 0, 2, 4, 3, 6, 6, 7, 1, 9, 4], fnv: 0x2f072467dee62194, state: r#"{"bit_generator": "PCG64", "state": {"state": 229418721207733456070118654256115438993, "inc": 87136372517582989555478159403783844777}, "has_uint32": 0, "uinteger": 2407225884}"# },
            Bandit { seed: 1, perms: &[&[0], &[0, 1], &[1, 0, 2], &[0, 1, 2, 3], &[2, 3, 1, 0, 4], &[2, 5, 4, 0, 3, 1], &[5, 1, 3, 4, 6, 0, 2], &[2, 6, 5, 0, 7, 4, 3, 1], &[1, 2, 3, 0, 4, 5, 8, 6, 7], &[7, 4, 2, 1, 5, 9, 3, 8, 6, 0], &[5, 10, 0, 7, 9, 1, 6, 4, 8, 3, 2], &[10, 4, 7, 5, 8, 6, 11, 9, 3, 2, 0, 1]], best: [0, 0, 1, 3, 3, 4, 4, 1, 4, 1, 4, 10], fnv: 0x98eb51cb502a8b78, state: r#"{"bit_generator": "PCG64", "state": {"state": 274899940543724587427091325169219068366, "inc": 194290289479364712180083596243593368443}, "has_uint32": 0, "uinteger": 2476906420}"# },
            Bandit { seed: 42, perms: &[&[0], &[1, 0], &[0, 2, 1], &[2, 3, 0, 1], &[2, 1, 0, 3, 4], &[3, 1, 4, 5, 2, 0], &[2, 6, 0, 1, 5, 4, 3], &[7, 1, 0, 4, 2, 3, 5, 6], &[1, 8, 3, 7, 4, 6, 2, 0, 5], &[8, 1, 7, 9, 3, 2, 4, 5, 6, 0], &[8, 10, 6, 4, 0, 1, 5, 3, 9, 7, 2], &[2, 8, 4, 10, 5, 11, 9, 0, 6, 1, 7, 3]], best: [0, 1, 2, 1, 3, 0, 6, 3, 3, 1, 10, 9], fnv: 0x8b1466ca036e6c3b, state: r#"{"bit_generator": "PCG64", "state": {"state": 55977171039653132519283170960668856152, "inc": 332724090758049132448979897138935081983}, "has_uint32": 0, "uinteger": 3973360653}"# },
            Bandit { seed: 123456, perms: &[&[0], &[1, 0], &[2, 0, 1], &[0, 2, 3, 1], &[2, 0, 3, 1, 4], &[0, 2, 5, 4, 1, 3], &[5, 3, 0, 2, 6, 4, 1], &[2, 3, 4, 1, 5, 0, 6, 7], &[4, 2, 0, 3, 7, 8, 1, 6, 5], &[8, 3, 2, 9, 0, 6, 5, 1, 4, 7], &[3, 10, 4, 2, 6, 1, 5, 0, 7, 9, 8], &[1, 9, 0, 10, 6, 11, 7, 8, 3, 4, 5, 2]], best: [0, 1, 2, 1, 3, 2, 1, 4, 4, 6, 10, 6], fnv: 0x51d7d6a61cabdc57, state: r#"{"bit_generator": "PCG64", "state": {"state": 1850453117313052573412836311872623319, "inc": 86625949289666656544807559270110712949}, "has_uint32": 0, "uinteger": 1209328973}"# },
            Bandit { seed: 1099511627783, perms: &[&[0], &[1, 0], &[1, 2, 0], &[3, 0, 2, 1], &[3, 1, 2, 0, 4], &[2, 1, 3, 0, 4, 5], &[5, 1, 6, 4, 2, 0, 3], &[2, 3, 0, 7, 5, 6, 1, 4], &[4, 2, 7, 1, 8, 3, 6, 0, 5], &[6, 7, 4, 0, 5, 2, 1, 9, 3, 8], &[5, 10, 3, 2, 0, 1, 6, 8, 4, 9, 7], &[8, 0, 1, 7, 3, 9, 5, 10, 4, 6, 2, 11]], best: [0, 0, 1, 0, 3, 4, 3, 1, 7, 9, 7, 7], fnv: 0xf5edbe3b8d1ed2e0, state: r#"{"bit_generator": "PCG64", "state": {"state": 180119457088915829014881862697493742751, "inc": 68082541654585819404063318752374113837}, "has_uint32": 0, "uinteger": 1864846029}"# },
        ];
        pub const NORMALS: &[Normals] = &[
            Normals { seed: 0, first: [0x3fc017ed89db8441, 0xbfc0e8cfe9bd45cc, 0x3fe47e57a468b06d, 0x3fbadabbec84d4f0, 0xbfe1243418e643ed, 0x3fd7245f95ced1e6], at_9999: 0x3ff07feba94175be, fnv: 0xe31739b16179638d, tail: 34, state: r#"{"bit_generator": "PCG64", "state": {"state": 155031586887524657028571379883557624689, "inc": 87136372517582989555478159403783844777}, "has_uint32": 0, "uinteger": 0}"# },
            Normals { seed: 1, first: [0x3fd61e0d28bbb3a1, 0x3fea4ab22204681f, 0x3fd525e18ce5fc0a, 0xbff4d9bb65b49607, 0x3fecf8acddd349f3, 0x3fdc9166a7847147], at_9999: 0x3fc7bdf2b5181ddb, fnv: 0x18759f0bd10565ec, tail: 33, state: r#"{"bit_generator": "PCG64", "state": {"state": 80175891553235723772630223184231308704, "inc": 194290289479364712180083596243593368443}, "has_uint32": 0, "uinteger": 0}"# },
            Normals { seed: 42, first: [0x3fd3807c1104fc6b, 0xbff0a3c65fca9a7e, 0x3fe803b239e77350, 0x3fee191b2d157f36, 0xbfff3770ac89d08f, 0xbff4d5ba2db7ebc8], at_9999: 0xbfc767a01c829b83, fnv: 0xacafe403595b2cb6, tail: 28, state: r#"{"bit_generator": "PCG64", "state": {"state": 116061672478686393367657149303519189031, "inc": 332724090758049132448979897138935081983}, "has_uint32": 0, "uinteger": 0}"# },
            Normals { seed: 123456, first: [0x3fc8ae5d6c3de7fd, 0xbfb0c5116b5d651d, 0x3fdbdf574822a2cd, 0x3fec3c486d68a684, 0x3fd7c3d5de801e3c, 0x3ff28f50701a4a25], at_9999: 0x3ffc45770a5ffe31, fnv: 0x8c641ba5bc3ef451, tail: 21, state: r#"{"bit_generator": "PCG64", "state": {"state": 11159011143355054952152389213928631727, "inc": 86625949289666656544807559270110712949}, "has_uint32": 0, "uinteger": 0}"# },
            Normals { seed: 1099511627783, first: [0xbff2c754dbb34494, 0x3fafc0e36b2c05ea, 0xbfd7088c449fa1d1, 0xbfe469ae0e4ca706, 0x3ff406c2544e8e68, 0x40027bf68518a834], at_9999: 0xbfa867876c45d201, fnv: 0x7d3427afb0cc3292, tail: 22, state: r#"{"bit_generator": "PCG64", "state": {"state": 218954880092584803352194703179214561674, "inc": 68082541654585819404063318752374113837}, "has_uint32": 0, "uinteger": 0}"# },
        ];
        pub const CHOICES_SEED_7: &[(usize, usize, &[usize], u64, &str)] = &[
            (5, 1, &[4], 0xaf63b94c8601b113, r#"{"bit_generator": "PCG64", "state": {"state": 202649823521392248019888743452465977457, "inc": 261136684632268670825940853076396136793}, "has_uint32": 1, "uinteger": 2684764585}"#),
            (1000, 1, &[625], 0xaf61ec4c85fea1bc, r#"{"bit_generator": "PCG64", "state": {"state": 202649823521392248019888743452465977457, "inc": 261136684632268670825940853076396136793}, "has_uint32": 0, "uinteger": 2684764585}"#),
            (10001, 10001, &[7743, 1267, 7558, 1736, 6711], 0xf3d5a9fe60c0c755, r#"{"bit_generator": "PCG64", "state": {"state": 149714347556490393503596517529151130249, "inc": 261136684632268670825940853076396136793}, "has_uint32": 0, "uinteger": 2347047362}"#),
            (10001, 200, &[1319, 3742, 2520, 6984, 964], 0xcfa44b85ac601ba3, r#"{"bit_generator": "PCG64", "state": {"state": 170221392253575201552333353446866962785, "inc": 261136684632268670825940853076396136793}, "has_uint32": 1, "uinteger": 2000535648}"#),
            (20000, 401, &[10317, 10287, 1359, 10973, 12044], 0xc9f46605bd7dc533, r#"{"bit_generator": "PCG64", "state": {"state": 7142401926151524252878998513048085817, "inc": 261136684632268670825940853076396136793}, "has_uint32": 0, "uinteger": 2260862483}"#),
            (8589934592, 3, &[6583826197, 6957874643, 5756840457], 0x66ce8bc0ee577270, r#"{"bit_generator": "PCG64", "state": {"state": 146633923672970401773844827540246232293, "inc": 261136684632268670825940853076396136793}, "has_uint32": 0, "uinteger": 47029755}"#),
        ];
        pub const RESUME_FROM: &str = r#"{"bit_generator": "PCG64", "state": {"state": 135016788538695038067117428507193281435, "inc": 324459057272246375853630270025492255805}, "has_uint32": 1, "uinteger": 2427050077}"#;
        pub const RESUMED: [u64; 8] = [0x90a9d85d, 0xf6213167, 0x8df4766c, 0x77af9f2c5a0c116e, 0x9c2cc2f91b3c403b, 0x3fe59970abcd3497, 0x3ff3e93b2d788f36, 0x3fec942c12dd6928];
        pub const RESUMED_STATE: &str = r#"{"bit_generator": "PCG64", "state": {"state": 260355457584927595694962539445750375277, "inc": 324459057272246375853630270025492255805}, "has_uint32": 0, "uinteger": 2381608556}"#;
    }

    /// The FNV-1a-style digest the script uses (64-bit words, not bytes).
    fn fnv(values: impl IntoIterator<Item = u64>) -> u64 {
        values.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, v| {
            (h ^ v).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    /// numpy's state in the JSON the expected values were printed as.
    fn state_json(rng: &NumpyRng) -> String {
        let s = rng.state();
        format!(
            "{{\"bit_generator\": \"PCG64\", \"state\": {{\"state\": {}, \"inc\": {}}}, \
             \"has_uint32\": {}, \"uinteger\": {}}}",
            s.state,
            s.inc,
            u8::from(s.has_uint32),
            s.uinteger
        )
    }

    /// The generator in a state printed as `state_json` prints it.
    fn rng_at(text: &str) -> NumpyRng {
        let number = |key: &str| -> u128 {
            let at = text.find(&format!("\"{key}\": ")).expect(key) + key.len() + 4;
            let digits: String = text[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().expect(key)
        };
        let state = NumpyRng::from_state(Pcg64State {
            state: number("state\": {\"state"),
            inc: number("inc"),
            has_uint32: number("has_uint32") == 1,
            uinteger: u32::try_from(number("uinteger")).expect("uinteger"),
        });
        assert_eq!(state_json(&state), text, "the helper reads what it writes");
        state
    }

    #[test]
    fn ziggurat_tables_match_numpys() {
        // numpy keeps the tables in `numpy/random/lib/libnpyrandom.a`; they were read
        // from the object `src_distributions_distributions.c.o` (symbols `ki_double`,
        // `wi_double`, `fi_double` in `.rodata`, 256 x 8 bytes each) with
        //     np.frombuffer(obj[rodata + sym.value:][:2048], '<u8' or '<f8')
        // and digested with `fnv` above.
        let t = ZigguratTables::get();
        assert_eq!(fnv(t.ki), 0x7ea1_a7e3_49ac_15b9, "ki");
        assert_eq!(fnv(t.wi.map(f64::to_bits)), 0xd986_c81d_1660_2f41, "wi");
        assert_eq!(fnv(t.fi.map(f64::to_bits)), 0x0f40_29a2_0099_d656, "fi");
        assert_eq!(t.ki[0], 0xe_f33d_8025_ef6a);
        assert_eq!(t.ki[2], 0xc_08be_98fb_c6a8);
        assert_eq!(t.wi[0].to_bits(), 0x3ccf_493b_7815_d979);
        assert_eq!(t.wi[1].to_bits(), 0x3c8b_8d0b_e3fd_f6c6);
        assert_eq!(t.wi[37].to_bits(), 0x3cab_f1d6_2abf_8232);
        assert_eq!(t.fi[1].to_bits(), 0x3fef_446a_c979_f087);
        assert_eq!(t.fi[38].to_bits(), 0x3fe5_ad29_acc8_5c89);
        assert_eq!(t.wi[255] * TWO_POW_52, ZIGGURAT_R);
        assert_eq!(
            "3.6541528853610087963519472518".parse::<f64>(),
            Ok(ZIGGURAT_R)
        );
        assert_eq!(
            "0.27366123732975827203338247596".parse::<f64>(),
            Ok(ZIGGURAT_INV_R)
        );
    }

    #[test]
    fn seeding_matches_numpy_default_rng() {
        for &(seed, state) in SEEDED {
            assert_eq!(state_json(&NumpyRng::from_seed(seed)), state, "seed {seed}");
        }
        for &(words, state) in SEEDED_WORDS {
            assert_eq!(
                state_json(&NumpyRng::from_seed_words(words)),
                state,
                "{words:?}"
            );
        }
        // numpy splits an integer seed into words; zero words padding the pool are free.
        assert_eq!(
            NumpyRng::from_seed(7),
            NumpyRng::from_seed_words(&[7, 0, 0, 0])
        );
        assert_eq!(NumpyRng::from_seed(0), NumpyRng::from_seed_words(&[]));
    }

    #[test]
    fn raw_streams_match_numpy() {
        for case in RAW {
            let mut rng = NumpyRng::from_seed(case.seed);
            let u64s = [(); 4].map(|()| rng.next_u64());
            assert_eq!(u64s, case.u64s, "seed {}", case.seed);
            let mut rng = NumpyRng::from_seed(case.seed);
            let mut mixed = Vec::new();
            mixed.extend((0..7).map(|_| u64::from(rng.next_u32())));
            mixed.extend((0..3).map(|_| rng.next_u64()));
            mixed.extend((0..2).map(|_| u64::from(rng.next_u32())));
            mixed.extend((0..3).map(|_| rng.next_double().to_bits()));
            assert_eq!(mixed, case.mixed, "seed {}", case.seed);
        }
    }

    #[test]
    fn bounded_matches_numpy_integers() {
        for &(seed, values, state) in BOUNDED {
            let mut rng = NumpyRng::from_seed(seed);
            rng.next_u32();
            let drawn = HIGHS.map(|high| rng.bounded(high - 1));
            assert_eq!(drawn, values, "seed {seed}");
            assert_eq!(state_json(&rng), state, "seed {seed}");
        }
        let mut rng = NumpyRng::from_seed(3);
        let before = rng.clone();
        assert_eq!(rng.bounded(0), 0);
        assert_eq!(rng, before, "a bound of 0 draws nothing");
        let mut copy = rng.clone();
        assert_eq!(rng.bounded(u64::MAX), copy.next_u64());
        assert_eq!(rng.bounded(u32::MAX.into()), u64::from(copy.next_u32()));
    }

    #[test]
    fn bandit_decisions_match_numpy() {
        for case in BANDIT {
            let mut rng = NumpyRng::from_seed(case.seed);
            let mut drawn = Vec::new();
            for n in 1..=12 {
                assert_eq!(
                    rng.choice_all(n),
                    case.perms[n - 1],
                    "seed {} n {n}",
                    case.seed
                );
                let samples: Vec<f64> = (0..n)
                    .map(|i| {
                        let arm = 8 * (i + 1);
                        let scale = if arm % 24 == 0 {
                            0.0
                        } else {
                            1.0 + arm as f64 / 64.0
                        };
                        rng.normal(10.0 + 0.25 * (i % 5) as f64, scale)
                    })
                    .collect();
                drawn.extend(samples.iter().map(|x| x.to_bits()));
                // Python's `max` keeps the first of equal samples.
                let best = (0..n).fold(0, |b, i| if samples[i] > samples[b] { i } else { b });
                assert_eq!(best, case.best[n - 1], "seed {} n {n}", case.seed);
            }
            assert_eq!(fnv(drawn), case.fnv, "seed {}", case.seed);
            assert_eq!(state_json(&rng), case.state, "seed {}", case.seed);
        }
    }

    #[test]
    fn standard_normals_match_numpy_bit_for_bit() {
        for case in NORMALS {
            let mut rng = NumpyRng::from_seed(case.seed);
            let z: Vec<f64> = (0..100_000).map(|_| rng.standard_normal()).collect();
            assert_eq!(
                z[..6].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                case.first
            );
            assert_eq!(z[9999].to_bits(), case.at_9999, "seed {}", case.seed);
            let tail = z.iter().filter(|x| x.abs() > ZIGGURAT_R).count();
            assert_eq!(tail, case.tail, "seed {}", case.seed);
            assert_eq!(
                fnv(z.iter().map(|x| x.to_bits())),
                case.fnv,
                "seed {}",
                case.seed
            );
            assert_eq!(state_json(&rng), case.state, "seed {}", case.seed);
        }
    }

    #[test]
    fn choice_matches_numpy_for_both_algorithms() {
        // (5, 1) and (1000, 1) are the simulator's single draws; 10001 items with more
        // than 10001 / 50 chosen take the tail shuffle, 200 of them Floyd's algorithm.
        let mut rng = NumpyRng::from_seed(7);
        for &(population, size, head, digest, state) in CHOICES_SEED_7 {
            let chosen = rng.choice(population, size);
            assert_eq!(chosen.len(), size);
            assert_eq!(&chosen[..head.len()], head, "{population} {size}");
            assert_eq!(
                fnv(chosen.iter().map(|&i| i as u64)),
                digest,
                "{population} {size}"
            );
            assert_eq!(state_json(&rng), state, "{population} {size}");
        }
        assert!(NumpyRng::from_seed(1).choice(0, 0).is_empty());
        assert!(NumpyRng::from_seed(1).choice(20_000, 0).is_empty());
    }

    #[test]
    fn a_stored_state_resumes_numpys_stream() {
        let mut rng = rng_at(RESUME_FROM);
        assert_eq!(state_json(&rng), RESUME_FROM);
        let mut rest = Vec::new();
        rest.extend((0..3).map(|_| u64::from(rng.next_u32())));
        rest.extend((0..2).map(|_| rng.next_u64()));
        rest.extend((0..3).map(|_| rng.standard_normal().to_bits()));
        assert_eq!(rest, RESUMED);
        assert_eq!(state_json(&rng), RESUMED_STATE);
    }
}
