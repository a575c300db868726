#include "profile_out.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "flag_values.h"
#include "mpi_launch.h"
#include "planner/hardware_profile.h"

namespace epinfer::cli {

void add_profile_out_options(CLI::App& app, std::string& profile_out, std::string& base_profile,
                             const std::string& what) {
    const CLI::Validator non_empty(
        [](std::string& value) { return value.empty() ? std::string("must not be empty") : std::string(); },
        "NONEMPTY");
    app.add_option("--profile-out", profile_out,
                   "also write a hardware profile (for plan --hardware) " + what)
        ->check(non_empty);
    app.add_option("--base-profile", base_profile,
                   "profile (name or FILE.json) whose other figures --profile-out keeps; required with it")
        ->check(non_empty);
}

Result<BaseProfile> load_base_profile(const std::string& profile_out, const std::string& name_or_file) {
    if (name_or_file.empty()) {
        return invalid_argument(
            fmt::format("--profile-out {} needs --base-profile NAME|FILE (the profile whose "
                        "other figures it keeps, e.g. h200_sxm)",
                        profile_out));
    }
    // The file is written after the measurements: refuse a path it cannot be written to before them.
    EPI_RETURN_IF_ERROR(check_output_file("--profile-out", profile_out));
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    EPI_ASSIGN_OR_RETURN(planner::HardwareProfile profile,
                         planner::resolve_hardware_profile(name_or_file, ec ? std::string() : exe.string()));
    std::ifstream in(profile.path, std::ios::binary);
    if (!in) return not_found(fmt::format("--base-profile {}: cannot read {}", name_or_file, profile.path));
    std::stringstream text;
    text << in.rdbuf();
    return BaseProfile{profile.path, text.str()};
}

std::string calibration_source() {
    Result<std::vector<std::string>> args = own_arguments();
    const std::string command =
        args.is_ok() ? fmt::format("epinfer {}", fmt::join(args.value(), " ")) : std::string("epinfer");
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    char date[32] = {};
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &utc);
    return fmt::format("{} on {}, {}", command, host, date);
}

Status write_calibrated_profile(const std::string& path, const BaseProfile& base,
                                const planner::Calibration& calibration) {
    EPI_ASSIGN_OR_RETURN(std::string text,
                         planner::calibrated_profile_json(base.text, base.path, calibration));
    std::ofstream out(path);
    out << text;
    if (!out) return not_found(fmt::format("--profile-out {}: cannot write the file", path));
    return Status::ok();
}

}  // namespace epinfer::cli
