// ReleaseKicker wakes the client's release flusher when a holder is released: the flusher
// sends the ack if no call carried it within the release delay. Shared by the client and
// its sessions, so a holder outliving its client kicks nothing harmful.
#pragma once

#include <condition_variable>
#include <mutex>

namespace fluxkv::detail {

struct ReleaseKicker {
  std::mutex mu;  // protects armed, stop
  std::condition_variable cv;
  bool armed = false;  // the flusher is awake and watching; kicks cost nothing then
  bool stop = false;

  void kick() {
    std::lock_guard lk(mu);
    if (!armed && !stop) {
      armed = true;
      cv.notify_one();
    }
  }
};

}  // namespace fluxkv::detail
