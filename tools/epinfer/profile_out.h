// `--profile-out FILE.json --base-profile NAME|FILE` of `epinfer bench comm`, `bench moe` and `bench
// attention`: the measurements written as a complete hardware profile (planner/calibration.h,
// docs/planner.md §1).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "planner/calibration.h"

namespace epinfer::cli {

// Adds --profile-out FILE.json (help: "also write a hardware profile (for plan --hardware) " + `what`) and
// --base-profile NAME|FILE to `app`, bound to `profile_out` and `base_profile`; an empty value of either is
// refused while parsing (one line naming the flag), so empty always means "not given".
void add_profile_out_options(CLI::App& app, std::string& profile_out, std::string& base_profile,
                             const std::string& what);

// The base profile's file and its text, read before anything is measured.
struct BaseProfile {
    std::string path;
    std::string text;
};

// Resolves `name_or_file` as `epinfer plan --hardware` does and reads its text.
// Errors: kInvalidArgument when `profile_out` is set without a base ("--profile-out needs --base-profile"),
// names a folder or an existing file that is not writable, or lies in a folder that is missing or not
// writable (checked before any measurement);
// otherwise those of planner::resolve_hardware_profile.
Result<BaseProfile> load_base_profile(const std::string& profile_out, const std::string& name_or_file);

// "epinfer <this process's arguments> on <host>, <UTC date and time>" for the figures' source.
std::string calibration_source();

// Writes planner::calibrated_profile_json(base, calibration) to `path`.
// Errors: those of calibrated_profile_json; kNotFound when the file cannot be written.
Status write_calibrated_profile(const std::string& path, const BaseProfile& base,
                                const planner::Calibration& calibration);

}  // namespace epinfer::cli
