from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"

    def ready(self) -> None:
        from django.contrib import admin

        # The admin's lists get the whole width of a 1,280 px screen: the app list is a
        # click away on the home page and in the breadcrumbs.
        admin.site.enable_nav_sidebar = False
        admin.site.site_header = admin.site.site_title = "Switchyard"
