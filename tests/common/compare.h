// Comparison of float tensors against a reference, with the metrics of tests/common/tolerances.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>

#include "common/tolerances.h"

namespace epinfer::test {

struct Diff {
    double nmse = 0.0;         // Σ(got − want)² / Σ want²
    double max_rel = 0.0;      // max |got − want| / max |want|
    int64_t worst_index = -1;  // index of the largest |got − want|
    bool size_mismatch = false;
    bool non_finite = false;  // got has a NaN/inf where want is finite
};

template <typename Want>
Diff compare(std::span<const float> got, std::span<const Want> want) {
    Diff d;
    if (got.size() != want.size()) {
        d.size_mismatch = true;
        return d;
    }
    double err_sq = 0.0, ref_sq = 0.0, max_err = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double w = static_cast<double>(want[i]), g = static_cast<double>(got[i]);
        if (!std::isfinite(g) && std::isfinite(w)) d.non_finite = true;
        const double e = std::abs(g - w);
        err_sq += e * e;
        ref_sq += w * w;
        max_ref = std::max(max_ref, std::abs(w));
        if (e > max_err) {
            max_err = e;
            d.worst_index = static_cast<int64_t>(i);
        }
    }
    d.nmse = ref_sq > 0.0 ? err_sq / ref_sq : err_sq;
    d.max_rel = max_ref > 0.0 ? max_err / max_ref : max_err;
    return d;
}

inline ::testing::AssertionResult within(const Diff& d, const Tolerance& tol) {
    std::ostringstream msg;
    msg << "nmse " << d.nmse << " (bound " << tol.max_nmse << "), max_rel " << d.max_rel << " (bound "
        << tol.max_rel << "), worst index " << d.worst_index;
    if (d.size_mismatch) return ::testing::AssertionFailure() << "size mismatch";
    if (d.non_finite) return ::testing::AssertionFailure() << "non-finite values; " << msg.str();
    if (d.nmse <= tol.max_nmse && d.max_rel <= tol.max_rel) return ::testing::AssertionSuccess() << msg.str();
    return ::testing::AssertionFailure() << msg.str();
}

}  // namespace epinfer::test
