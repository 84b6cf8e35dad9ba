// The local provider's record of each sandbox, kept on disk under the state directory so that
// sandboxes outlive the process that created them and can be found again by label.
//
//   <state>/sandboxes/<id>/               the sandbox's subvolume (see volume.h)
//   <state>/sandboxes/<id>/sandbox.json   the record below
//   <state>/sandboxes/<id>/control.sock   init's exec socket
//   <state>/sandboxes/<id>/root/          mount point of the sandbox's root (inside its mount
//                                         namespace only; empty on the host)
//   <state>/sandboxes/<id>/init.log       what init printed, for diagnosis
//   <state>/sandboxes/<id>/upper, work/   the writable layer of its overlay root
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "sandbox/provider.h"

namespace quarry::sandbox::local {

struct SandboxRecord {
  std::string id;
  Labels labels;
  ResourceLimits resources;
  std::string image;  // image hash
  // The snapshot whose frozen layers it has above the image ("" for none): the one asked for,
  // or the package snapshot made on it.
  std::string snapshot;
  std::vector<std::string> packages;  // extra Python packages asked for (canonical)
  pid_t init_pid = 0;
  uint64_t init_start_time = 0;  // /proc/<pid>/stat field 22, to tell a reused pid apart
  uint64_t qgroup = 0;           // btrfs qgroup of the sandbox's subvolume
  // The host id that root inside maps to; the sandbox's ids are this and the next 65535.
  uint32_t id_base = 0;
  std::chrono::system_clock::time_point created_at;
  NetworkPolicy network;  // allowlist: its proxy runs in the sandbox's `proxy` cgroup
};

// A create in progress, as admission counts it: the sandbox's id once drawn (else empty).
struct AdmissionTicket {
  std::string sandbox_id;
  ResourceLimits limits;
};

class StateStore {
 public:
  explicit StateStore(std::filesystem::path state_dir);

  const std::filesystem::path& state_dir() const { return state_dir_; }
  std::filesystem::path sandbox_dir(std::string_view id) const;
  std::filesystem::path control_socket(std::string_view id) const;

  Result<void> save(const SandboxRecord& record) const;
  // kNotFound names the id when there is no such sandbox.
  Result<SandboxRecord> load(std::string_view id) const;
  // Every complete record (sandboxes still being created are skipped).
  Result<std::vector<SandboxRecord>> list() const;
  // Sandbox directories with no record that have not changed for `quiet`: what a
  // create cut short (its process killed half way) left behind, with the time each last
  // changed. Younger ones may be a create still under way in another process.
  std::vector<std::pair<std::string, std::chrono::system_clock::time_point>> abandoned(
      std::chrono::seconds quiet) const;

  // A host id range of its own for sandbox `id`: kSandboxIdCount ids from the returned base,
  // used by no other sandbox of any quarry process (each claim is a file <state>/id-ranges/
  // <base> made with O_EXCL, naming its sandbox; a claim whose sandbox is gone is taken over).
  // The image's own range (kSandboxIdBase) is never handed out. Whether a host process runs
  // with ids of the range is for the caller to check (HostIds).
  Result<uint32_t> claim_id_range(std::string_view id) const;
  // Gives the range back (missing is fine).
  void release_id_range(uint32_t base) const;

  // Admission in every process: a sandbox being created counts by a ticket until its record
  // is saved, a file <state>/admitting/<pid>-<n> with its limits, renamed to <pid>-<n>-<id>
  // once it has an id. Counting the tickets, adding one and naming one hold
  // <state>/admitting/.lock.
  Result<UniqueFd> lock_admissions() const;
  // The tickets of the sandboxes being created, with the ids they name. Read them before the
  // records, and count a ticket only if its id is not among the records read: a sandbox whose
  // record is saved in between is then counted once, by its ticket (a ticket is named before
  // its record is saved). A ticket whose process is gone, or older than `max_age`, is removed
  // instead. Under lock_admissions.
  Result<std::vector<AdmissionTicket>> admitting(std::chrono::seconds max_age) const;
  // A ticket for `limits` (under lock_admissions); its name.
  Result<std::string> add_ticket(const ResourceLimits& limits) const;
  // The ticket renamed to name the sandbox's id: its new name (its old one if that failed).
  // Takes lock_admissions itself: not to be called under it.
  std::string name_ticket(const std::string& ticket, std::string_view id) const;
  void remove_ticket(const std::string& ticket) const;

 private:
  std::filesystem::path state_dir_;
  std::filesystem::path sandboxes_dir_;
  std::filesystem::path admitting_dir_;
};

// The effective uids from `lowest` up that the host's processes run with: the owner of each
// /proc/<pid>, one fstatat a process. Sorted, each once.
std::vector<uint32_t> host_ids_from(uint32_t lowest);

// Whether any process on the host runs with an effective uid in a sandbox's range: such a
// range is someone's, whatever the claims say. The host's ids are read (host_ids_from) at most
// once per `max_age` and kept, so a server starting sandboxes on a host of thousands of
// processes does not walk /proc for each (about 7 ms of CPU at 3,000 processes). What it misses
// meanwhile, a process that took ids of a free range since the last reading, any check misses
// that starts right after it; a range freed and claimed again within `max_age` is seen in use
// by the processes it had, and its create draws another. Safe to share between threads.
class HostIds {
 public:
  using Scan = std::function<std::vector<uint32_t>()>;
  // `scan` reads the ids (when null: host_ids_from the lowest sandbox id).
  explicit HostIds(std::chrono::milliseconds max_age = std::chrono::seconds(1),
                   Scan scan = nullptr);

  bool in_use(uint32_t base, uint32_t count);

 private:
  const std::chrono::milliseconds max_age_;
  const Scan scan_;
  std::mutex mutex_;
  std::vector<uint32_t> ids_;
  std::optional<std::chrono::steady_clock::time_point> read_at_;
};

// Sandbox ids are 12 lowercase hex digits; anything else is refused before touching disk.
bool valid_sandbox_id(std::string_view id);

}  // namespace quarry::sandbox::local
