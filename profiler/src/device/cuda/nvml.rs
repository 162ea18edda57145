//! The few NVML calls the harness needs (clocks, temperature, power, throttle reasons, driver
//! version, UUID, memory bus), loaded at run time from libnvidia-ml.so.1.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

use libloading::{Library, Symbol};

use crate::device::Telemetry;

type Device = *mut c_void;
const NVML_CLOCK_SM: c_int = 1;
const NVML_CLOCK_MEM: c_int = 2;
const NVML_TEMPERATURE_GPU: c_int = 0;

pub struct Nvml {
    lib: Library,
}

impl Nvml {
    /// Loads and initialises NVML; `None` where the library is missing (containers without the
    /// driver's utilities): collection goes on without telemetry.
    pub fn open() -> Option<Nvml> {
        let lib = ["libnvidia-ml.so.1", "libnvidia-ml.so"]
            .iter()
            .find_map(|name| unsafe { Library::new(name).ok() })?;
        let nvml = Nvml { lib };
        let init: Symbol<unsafe extern "C" fn() -> c_int> =
            unsafe { nvml.lib.get(b"nvmlInit_v2\0").ok()? };
        (unsafe { init() } == 0).then_some(nvml)
    }

    fn handle(&self, index: u32) -> Option<Device> {
        let f: Symbol<unsafe extern "C" fn(c_uint, *mut Device) -> c_int> =
            unsafe { self.lib.get(b"nvmlDeviceGetHandleByIndex_v2\0").ok()? };
        let mut dev: Device = std::ptr::null_mut();
        (unsafe { f(index, &mut dev) } == 0).then_some(dev)
    }

    fn uint(&self, symbol: &[u8], index: u32, arg: Option<c_int>) -> Option<u32> {
        let dev = self.handle(index)?;
        let mut out: c_uint = 0;
        let rc = unsafe {
            match arg {
                Some(a) => {
                    let f: Symbol<unsafe extern "C" fn(Device, c_int, *mut c_uint) -> c_int> =
                        self.lib.get(symbol).ok()?;
                    f(dev, a, &mut out)
                }
                None => {
                    let f: Symbol<unsafe extern "C" fn(Device, *mut c_uint) -> c_int> =
                        self.lib.get(symbol).ok()?;
                    f(dev, &mut out)
                }
            }
        };
        (rc == 0).then_some(out)
    }

    fn string(&self, f: impl FnOnce(*mut c_char, c_uint) -> c_int) -> Option<String> {
        let mut buf = [0 as c_char; 96];
        if f(buf.as_mut_ptr(), buf.len() as c_uint) != 0 {
            return None;
        }
        Some(
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    pub fn driver_version(&self) -> Option<String> {
        let f: Symbol<unsafe extern "C" fn(*mut c_char, c_uint) -> c_int> =
            unsafe { self.lib.get(b"nvmlSystemGetDriverVersion\0").ok()? };
        self.string(|p, n| unsafe { f(p, n) })
    }

    pub fn uuid(&self, index: u32) -> Option<String> {
        let dev = self.handle(index)?;
        let f: Symbol<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int> =
            unsafe { self.lib.get(b"nvmlDeviceGetUUID\0").ok()? };
        self.string(|p, n| unsafe { f(dev, p, n) })
    }

    /// Peak HBM bandwidth from the memory clock and bus width (double data rate), GB/s.
    pub fn memory_bandwidth_gb_per_s(&self, index: u32) -> Option<f64> {
        let clock = self.uint(b"nvmlDeviceGetMaxClockInfo\0", index, Some(NVML_CLOCK_MEM))?;
        let width = self.uint(b"nvmlDeviceGetMemoryBusWidth\0", index, None)?;
        Some(2.0 * clock as f64 * 1e6 * width as f64 / 8.0 / 1e9)
    }

    pub fn max_sm_clock_mhz(&self, index: u32) -> Option<u32> {
        self.uint(b"nvmlDeviceGetMaxClockInfo\0", index, Some(NVML_CLOCK_SM))
    }

    pub fn power_limit_w(&self, index: u32) -> Option<u32> {
        self.uint(b"nvmlDeviceGetPowerManagementLimit\0", index, None)
            .map(|mw| mw / 1000)
    }

    pub fn telemetry(&self, index: u32) -> Option<Telemetry> {
        let reasons = (|| {
            let dev = self.handle(index)?;
            let f: Symbol<unsafe extern "C" fn(Device, *mut c_ulonglong) -> c_int> = unsafe {
                self.lib
                    .get(b"nvmlDeviceGetCurrentClocksEventReasons\0")
                    .or_else(|_| self.lib.get(b"nvmlDeviceGetCurrentClocksThrottleReasons\0"))
                    .ok()?
            };
            let mut out: c_ulonglong = 0;
            (unsafe { f(dev, &mut out) } == 0).then_some(out)
        })();
        Some(Telemetry {
            sm_clock_mhz: self.uint(b"nvmlDeviceGetClockInfo\0", index, Some(NVML_CLOCK_SM))?,
            max_sm_clock_mhz: self.max_sm_clock_mhz(index).unwrap_or(0),
            temperature_c: self
                .uint(
                    b"nvmlDeviceGetTemperature\0",
                    index,
                    Some(NVML_TEMPERATURE_GPU),
                )
                .unwrap_or(0),
            power_w: self
                .uint(b"nvmlDeviceGetPowerUsage\0", index, None)
                .map(|mw| mw as f64 / 1000.0)
                .unwrap_or(0.0),
            throttle_reasons: reasons.unwrap_or(0),
        })
    }
}
